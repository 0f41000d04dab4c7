#!/usr/bin/env bash
# dnsmasq from Debian's source package, built with clang-19 and coverage,
# for tests/tests/dnsmasq.rs (the agent preloaded into a real daemon that
# closes every descriptor it did not open as it starts), in
# target/dnsmasq/current/src/src/dnsmasq (see debian-source.sh). Built with
# its own Makefile and default options: no D-Bus, IDN, DNSSEC or conntrack,
# nothing from a -dev package.
set -euo pipefail
. "$(dirname "$0")/debian-source.sh"

built() { [ -x "$1/src/src/dnsmasq" ]; }
build() {
    make -j"$(nproc)" CC="$cc" COPTS="" CFLAGS="-O0 -g -fprofile-instr-generate -fcoverage-mapping" \
        LDFLAGS="-fprofile-instr-generate" >"$1/make.log" 2>&1 || { tail -n 30 "$1/make.log" >&2; exit 1; }
}
build_debian_source dnsmasq built build
