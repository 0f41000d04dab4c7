#!/usr/bin/env bash
# {fmt} from Debian's source package (fmtlib), its test suite built by
# clang++-19 with coverage: several executables that share the library's
# functions and instantiate the same templates, as a C++ test suite does
# (tests/tests/test_suites.rs). Built once under target/fmtlib/ (see
# debian-source.sh); `make test` runs it through install-deps.sh.
set -euo pipefail
. "$(dirname "$0")/debian-source.sh"

# The test executables built: quick to build, and each links the library.
tests="args-test assert-test color-test core-test ostream-test printf-test ranges-test"

# Debian builds the tests against its googletest sources (/usr/src/googletest).
ensure_packages deps-fmt cmake googletest

built() {
    local t
    for t in $tests; do [ -x "$1/build/bin/$t" ] || return 1; done
}
build() {
    mkdir -p "$1/build"
    (cd "$1/build" && CC="$cc" CXX="clang++-${cc#clang-}" cmake "$1/src" -DCMAKE_BUILD_TYPE=Debug \
        -DFMT_TEST=ON -DFMT_DOC=OFF -DCMAKE_CXX_FLAGS="-O0 -fprofile-instr-generate -fcoverage-mapping" \
        -DCMAKE_EXE_LINKER_FLAGS="-fprofile-instr-generate") >"$1/cmake.log" 2>&1 ||
        { tail -n 30 "$1/cmake.log" >&2; exit 1; }
    # shellcheck disable=SC2086 # one target per word
    LLVM_PROFILE_FILE="$1/build-%p.profraw" make -C "$1/build" -j"$(nproc)" $tests >"$1/make.log" 2>&1 ||
        { tail -n 30 "$1/make.log" >&2; exit 1; }
    rm -f "$1"/build-*.profraw
}
build_debian_source fmtlib built build
