#!/usr/bin/env bash
# Seeds corpus/go_coverage with real Go coverage data: the Go fixture
# service built as the tests build it (target/fixtures/go/atomic/shop, with
# the Go toolchain of tests/scripts/deps-go.sh), a few requests, then its
# ?format=covdata snapshot, in the layout of fuzz_targets/go_coverage.rs
# (u32 LE meta-data length, meta-data, counters).
#
# Then: cargo +nightly fuzz run go_coverage -- -max_total_time=60
set -euo pipefail

fuzz=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$fuzz/../.." && pwd)
shop="$root/target/fixtures/go/atomic/shop"
bash "$root/tests/scripts/deps-go.sh"
# As tests/src/go.rs builds it (Go's build cache makes it quick when built).
(cd "$root/fixtures/go/service" && GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=mod \
    "$root/target/go-venv/bin/go" build -cover -covermode=atomic -coverpkg=./...,net/http -o "$shop" .)

work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
LIVECOV_DIR="$work/cov" "$shop" -addr 127.0.0.1:0 > "$work/out" 2> /dev/null &
pid=$!
until [ -S "$(ls "$work"/cov/sockets/*.sock 2> /dev/null)" ]; do sleep 0.1; done
app=$(sed -n 's/^listening on //p' "$work/out")
sock=$(ls "$work"/cov/sockets/*.sock)
mkdir -p "$fuzz/corpus/go_coverage"
for path in /items/milk /sum?workers=3 /fib?n=7; do
    curl -s "$app$path" > /dev/null
    curl -s --unix-socket "$sock" 'localhost/coverage?format=covdata' -o "$work/snap.tar"
    rm -rf "$work/snap" && mkdir "$work/snap" && tar -xf "$work/snap.tar" -C "$work/snap"
    python3 - "$work/snap" "$fuzz/corpus/go_coverage" <<'PY'
import hashlib, pathlib, struct, sys
snap, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
meta = next(snap.glob("covmeta.*")).read_bytes()
counters = next(snap.glob("covcounters.*")).read_bytes()
seed = struct.pack("<I", len(meta)) + meta + counters
(out / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
PY
done
ls "$fuzz/corpus/go_coverage" | wc -l
