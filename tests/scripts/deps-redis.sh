#!/usr/bin/env bash
# redis from Debian's source package, built with clang-19 and coverage, for
# tests/tests/redis.rs (warm dumps under traffic, against llvm-cov),
# bench-busy.sh and bench-fleet.sh (48 replicas of a real C server with the
# agent preloaded), in target/redis/current/src/src (see debian-source.sh). Built
# with redis's own Makefile and its bundled deps (hiredis, lua, linenoise,
# hdr_histogram), libc's malloc (no jemalloc), no TLS, no systemd: nothing
# from a -dev package. CFLAGS reach redis and its deps, so the Lua
# interpreter and hiredis are instrumented too. redis-server, redis-cli and
# redis-benchmark come out of one build. `make test` runs it through
# install-deps.sh.
set -euo pipefail
. "$(dirname "$0")/debian-source.sh"

built() { [ -x "$1/src/src/redis-server" ] && [ -x "$1/src/src/redis-benchmark" ] && [ -x "$1/src/src/redis-cli" ]; }
build() {
    # OPTIMIZATION replaces redis's default (-O2, and -flto on some
    # versions, which needs a linker plugin). LLVM_PROFILE_FILE: nothing
    # instrumented runs during the build, but should it, its profile stays
    # out of the sources.
    LLVM_PROFILE_FILE="$1/build-%p.profraw" make -j"$(nproc)" CC="$cc" OPTIMIZATION="-O1" \
        CFLAGS="-g -fprofile-instr-generate -fcoverage-mapping" LDFLAGS="-fprofile-instr-generate" \
        MALLOC=libc BUILD_TLS=no USE_SYSTEMD=no V=1 >"$1/make.log" 2>&1 ||
        { tail -n 30 "$1/make.log" >&2; exit 1; }
    rm -f "$1"/build-*.profraw
}
build_debian_source redis built build
