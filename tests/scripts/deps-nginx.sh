#!/usr/bin/env bash
# nginx from Debian's source package, built with clang-19 and coverage, for
# tests/tests/nginx.rs (the agent preloaded into a real pre-fork daemon), in
# target/nginx/current (see debian-source.sh). Configured with the modules
# that need no -dev library: rewrite (PCRE) and gzip (zlib) off; SSL is off
# unless asked for.
set -euo pipefail
. "$(dirname "$0")/debian-source.sh"

built() { [ -x "$1/src/objs/nginx" ]; }
build() {
    ./configure --with-cc="$cc" --with-cc-opt="-O0 -g -fprofile-instr-generate -fcoverage-mapping" \
        --with-ld-opt="-fprofile-instr-generate" --without-pcre --without-http_rewrite_module \
        --without-http_gzip_module >"$1/configure.log" 2>&1 || { tail -n 30 "$1/configure.log" >&2; exit 1; }
    make -j"$(nproc)" >"$1/make.log" 2>&1 || { tail -n 30 "$1/make.log" >&2; exit 1; }
}
build_debian_source nginx built build
