#!/usr/bin/env bash
# Benchmarks the Go hook (hooks/go) on the Go fixture service
# (fixtures/go/service, GET /items/milk), and prints markdown tables:
#
# 1. Dumps: the service built with -coverpkg=./...,net/http (as the tests
#    build it) and with -coverpkg=all (the whole standard library), after a
#    request: the median and p95 wall time of BENCH_GO_DUMPS (default 30)
#    GET /coverage over the socket, and of ?format=covdata; the report's
#    size.
# 2. Requests/s, wrk -t1 -c4 on 127.0.0.1 for BENCH_GO_LOAD_SECS (default
#    10) s: a build without -cover, the coverage build without the hook's
#    variables (what Go's counters cost by themselves), with LIVECOV_DIR
#    (the hook serving), and with a loop fetching /coverage every 100 ms.
#    BENCH_GO_ROUNDS (default 3) rounds, each configuration in turn, the
#    median of each.
#
# Uses the Go of tests/scripts/deps-go.sh (installed if need be). Every
# loop is bounded in count and time; only loopback addresses. Not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
load_secs=${BENCH_GO_LOAD_SECS:-10}
rounds=${BENCH_GO_ROUNDS:-3}
dumps=${BENCH_GO_DUMPS:-30}
source "$root/tests/scripts/bench-common.sh"

install_tools wrk=wrk curl=curl
"$root/tests/scripts/deps-go.sh"
go="$root/target/go-venv/bin/go"
out="$root/target/bench-go"
rm -rf "$out/run"
mkdir -p "$out/run"

echo "bench-go: building the fixture service (no -cover, -coverpkg=./...,net/http, -coverpkg=all)"
build() { (cd "$root/fixtures/go/service" && "${clean_env[@]}" -u GOCOVERDIR GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=mod "$go" build "$@" .); }
build -o "$out/plain"
build -cover -covermode=atomic -coverpkg=./...,net/http -o "$out/nethttp"
build -cover -covermode=atomic -coverpkg=all -o "$out/all"

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

# start NAME BINARY [VAR=VALUE...]: the service in $out/run/NAME, its
# address in $addr, its pid in $pid; with LIVECOV_DIR, its socket in $sock.
start() {
    local name=$1 binary=$2
    shift 2
    mkdir -p "$out/run/$name"
    "${clean_env[@]}" -u GOCOVERDIR "$@" "$binary" -addr 127.0.0.1:0 > "$out/run/$name/out" 2> "$out/run/$name/err" &
    pid=$!
    pids+=("$pid")
    wait_for 100 grep -q '^listening on' "$out/run/$name/out"
    addr=$(sed -n 's/^listening on //p' "$out/run/$name/out")
    sock=""
    if [[ " $* " == *" LIVECOV_DIR="* ]]; then
        wait_for 100 compgen -G "$out/run/$name/cov/sockets/*.sock" > /dev/null
        sock=$(compgen -G "$out/run/$name/cov/sockets/*.sock")
    fi
}

echo
echo "| build | dump, median ms | dump, p95 ms | covdata, median ms | report |"
echo "|---|---:|---:|---:|---:|"
for build in nethttp all; do
    start "dumps-$build" "$out/$build" LIVECOV_DIR="$out/run/dumps-$build/cov"
    curl -s "http://$addr/items/milk" > /dev/null
    times=() covdata=()
    for _ in $(seq "$dumps"); do
        times+=("$(curl -s -o "$out/run/dumps-$build/report.lcov" -w '%{time_total}' --unix-socket "$sock" localhost/coverage)")
        covdata+=("$(curl -s -o /dev/null -w '%{time_total}' --unix-socket "$sock" 'localhost/coverage?format=covdata')")
    done
    ms() { tr ' ' '\n' | awk '{ printf "%.1f\n", $1 * 1000 }'; }
    files=$(grep -c '^SF:' "$out/run/dumps-$build/report.lcov")
    size=$(du -k "$out/run/dumps-$build/report.lcov" | cut -f1)
    echo "| -coverpkg=$([ $build = all ] && echo all || echo ./...,net/http) | $(echo "${times[*]}" | ms | median) | $(echo "${times[*]}" | ms | p95) | $(echo "${covdata[*]}" | ms | median) | $files files, $size KiB |"
    kill "$pid"
done

declare -A results
configs=(plain cover hook dumps)
for round in $(seq "$rounds"); do
    for config in "${configs[@]}"; do
        case $config in
            plain) start "$config-$round" "$out/plain" ;;
            cover) start "$config-$round" "$out/nethttp" ;;
            *) start "$config-$round" "$out/nethttp" LIVECOV_DIR="$out/run/$config-$round/cov" ;;
        esac
        dumper=""
        if [ "$config" = dumps ]; then
            (for _ in $(seq $((load_secs * 10 + 20))); do curl -s -o /dev/null --unix-socket "$sock" localhost/coverage; sleep 0.1; done) &
            dumper=$!
        fi
        rps=$(wrk -t1 -c4 -d"${load_secs}s" "http://$addr/items/milk" | awk '/^Requests\/sec/ { print $2 }')
        results[$config]+="$rps "
        [ -z "$dumper" ] || kill "$dumper" 2>/dev/null || true
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    done
done

echo
echo "Requests/s, wrk -t1 -c4, ${load_secs} s, median of $rounds (load $(load)):"
echo
echo "| build | requests/s |"
echo "|---|---:|"
echo "| no -cover | $(echo "${results[plain]}" | tr ' ' '\n' | grep . | median) |"
echo "| -cover -covermode=atomic -coverpkg=./...,net/http, no hook variables | $(echo "${results[cover]}" | tr ' ' '\n' | grep . | median) |"
echo "| the same with LIVECOV_DIR (the hook) | $(echo "${results[hook]}" | tr ' ' '\n' | grep . | median) |"
echo "| the hook, /coverage every 100 ms | $(echo "${results[dumps]}" | tr ' ' '\n' | grep . | median) |"
