#!/usr/bin/env bash
# The main job on one machine: a Rust service built with coverage and the
# livecov agent answers "your coverage, now" over its Unix socket while it
# runs; the demo drives some traffic, fetches the live LCOV, prints a
# per-file summary, and stops the service with SIGTERM (its final report
# lands in reports/).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
work="$root/target/demo"
rm -rf "$work" && mkdir -p "$work"
host=$(rustc -vV | sed -n 's/^host: //p')
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

echo "==> building fixtures/service with -C instrument-coverage and the livecov agent"
(
    cd fixtures/service
    env -u RUSTC_WRAPPER -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET \
        RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$root/target/fixtures/service" \
        cargo build --quiet --target "$host"
)
service="$root/target/fixtures/service/$host/debug/service"

echo "==> starting it with LIVECOV_DIR=$work/cov"
LIVECOV_DIR="$work/cov" LLVM_PROFILE_FILE="$work/exit.profraw" "$service" > "$work/service.out" &
pid=$!
for _ in $(seq 100); do grep -q listening "$work/service.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/^listening on .*://p' "$work/service.out")
socket=$(ls "$work"/cov/sockets/*.sock)
echo "    service on 127.0.0.1:$port, agent on $socket"

echo "==> driving traffic"
curl -s "127.0.0.1:$port/hello?name=demo" >/dev/null
curl -s "127.0.0.1:$port/fib?n=30" >/dev/null
curl -s "127.0.0.1:$port/primes?limit=100" >/dev/null

echo "==> fetching live coverage: curl --unix-socket $socket localhost/coverage"
curl -s --unix-socket "$socket" localhost/coverage > "$work/live.lcov"
awk -v root="$root/" '
    BEGIN { printf "%-40s %6s %6s %8s\n", "file", "lines", "hit", "cover" }
    /^SF:/ { file = substr($0, 4); sub(root, "", file) }
    /^LF:/ { lf = substr($0, 4) }
    /^LH:/ { lh = substr($0, 4) }
    /^end_of_record/ {
        printf "%-40s %6d %6d %7.1f%%\n", file, lf, lh, lf ? 100 * lh / lf : 0
        tf += lf; th += lh
    }
    END { printf "%-40s %6d %6d %7.1f%%\n", "total", tf, th, tf ? 100 * th / tf : 0 }
' "$work/live.lcov"

echo "==> SIGTERM: the agent writes a final report, then the service ends as SIGTERM would end it"
kill -TERM "$pid"; wait "$pid" || true; pid=""
echo
echo "live LCOV:    $work/live.lcov"
echo "final report: $(ls "$work"/cov/reports/*.lcov)"
if command -v genhtml >/dev/null; then
    genhtml -q -o "$work/html" "$work/live.lcov" && echo "HTML report:  $work/html/index.html"
fi
