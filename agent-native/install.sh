#!/usr/bin/env sh
# Builds liblivecov (unless told where it is) and installs it under PREFIX:
#   PREFIX/lib/liblivecov.so, PREFIX/lib/liblivecov.a,
#   PREFIX/include/livecov.h, PREFIX/lib/pkgconfig/livecov.pc
#
#   agent-native/install.sh PREFIX [BUILD_DIR]
#
# BUILD_DIR holds liblivecov.so and liblivecov.a already built (default:
# build them with `cargo build -p livecov-native --profile release-native`
# and take them from target/release-native).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:?usage: install.sh PREFIX [BUILD_DIR]}
build=${2:-}
if [ -z "$build" ]; then
    (cd "$here/.." && cargo build --quiet -p livecov-native --profile release-native)
    build=${CARGO_TARGET_DIR:-$here/../target}/release-native
fi
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$here/../Cargo.toml" | head -n 1)

mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
cp "$build/liblivecov.so" "$build/liblivecov.a" "$prefix/lib/"
cp "$here/include/livecov.h" "$prefix/include/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/livecov.pc.in" > "$prefix/lib/pkgconfig/livecov.pc"
echo "installed liblivecov $version in $prefix"
