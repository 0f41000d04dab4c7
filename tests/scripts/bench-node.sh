#!/usr/bin/env bash
# Benchmarks the Node hook (hooks/node/livecov-hook.cjs) on the HTTP fixture
# (fixtures/node/http/server.js, GET /items?n=3) and prints markdown tables:
#
# 1. Requests/s under wrk (-t1 -c8, BENCH_NODE_LOAD_SECS s, default 10) on
#    127.0.0.1: without the hook, with the hook (no dumps), with the hook
#    while a client fetches /coverage over its Unix socket every 100 ms, and,
#    for scale, under NODE_V8_COVERAGE (what c8 runs programs with: the same
#    V8 coverage mode, from Node.js's start); BENCH_NODE_ROUNDS (default 3)
#    rounds of the four in turn, the median of each. Also the program's CPU
#    time per request (user + system, from /proc: steadier than requests/s
#    on a busy machine), its resident memory at the end, and the dumps'
#    times.
# 2. The same for worker threads (fixtures/node/workers/server.js, GET
#    /square?n=50, computed by a pool of two workers whose counts the hook
#    gathers at every dump): without the hook, with it, with it and a dump
#    every 100 ms; BENCH_NODE_WORKERS=0 leaves this part out.
# 3. The start cost: `node -e 0` with and without the hook, BENCH_NODE_STARTS
#    (default 20) runs each: the median wall time, and the mean CPU time
#    (user + system).
#
# Every loop is bounded in count and time; only loopback addresses. Run from
# anywhere; not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
load_secs=${BENCH_NODE_LOAD_SECS:-10}
rounds=${BENCH_NODE_ROUNDS:-3}
starts=${BENCH_NODE_STARTS:-20}
workers=${BENCH_NODE_WORKERS:-1}
hook="$root/hooks/node/livecov-hook.cjs"
source "$root/tests/scripts/bench-common.sh"

# use_app APP PATH ANSWER: the fixture that start_app starts, the request wrk
# sends, and the answer (an extended regex) it must give.
use_app() { app=$1; bench_path=$2; bench_answer=$3; }
use_app "$root/fixtures/node/http/server.js" "/items?n=3" '^\["anvil","bucket","chisel"\]$'

if ! command -v node >/dev/null; then
    echo "bench-node: node is missing (tests/scripts/install-deps.sh installs it)" >&2
    exit 1
fi
install_tools wrk=wrk curl=curl
# Nothing of the caller's may turn the hook on, or coverage of another kind.
while IFS= read -r name; do
    case "$name" in LIVECOV_*|NODE_OPTIONS|NODE_V8_COVERAGE) unset "$name" ;; esac
done < <(compgen -e)

work="$root/target/bench-node"
rm -rf "$work"
mkdir -p "$work"

pid=""
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; }
trap cleanup EXIT

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
p95() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else { i = int(NR * 0.95 + 0.999); if (i > NR) i = NR; print v[i] } }'; }

# start_app DIR off|hook|v8: starts the fixture, sets pid, port and socket.
start_app() {
    local dir=$1
    mkdir -p "$dir"
    case "$2" in
        hook) LIVECOV_DIR="$dir/cov" NODE_OPTIONS="--require $hook" node "$app" >"$dir/stdout" 2>"$dir/stderr" & ;;
        v8) NODE_V8_COVERAGE="$dir/v8" node "$app" >"$dir/stdout" 2>"$dir/stderr" & ;;
        *) node "$app" >"$dir/stdout" 2>"$dir/stderr" & ;;
    esac
    pid=$!
    for _ in $(seq 200); do
        grep -q '^listening on ' "$dir/stdout" && break
        sleep 0.05
    done
    port=$(sed -n 's/^listening on .*://p' "$dir/stdout")
    [ -n "$port" ] || { echo "bench-node: the app did not start:" >&2; cat "$dir/stderr" >&2; exit 1; }
    socket=""
    if [ "$2" = hook ]; then
        for _ in $(seq 100); do
            socket=$(ls "$dir"/cov/sockets/node-"$pid"-*.sock 2>/dev/null || true)
            [ -n "$socket" ] && break
            sleep 0.05
        done
        [ -n "$socket" ] || { echo "bench-node: the hook made no socket:" >&2; cat "$dir/stderr" >&2; exit 1; }
    fi
    curl -sS --max-time 10 "http://127.0.0.1:$port$bench_path" | grep -Eq "$bench_answer" ||
        { echo "bench-node: $bench_path answered wrong" >&2; exit 1; }
}

stop_app() {
    curl -sS --max-time 10 "http://127.0.0.1:$port/quit" >/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)

# wrk_run SECS OUT [CPU_OUT]: prints requests/s; appends the program's CPU
# microseconds per request to CPU_OUT.
wrk_run() {
    local t0
    t0=$(ticks)
    wrk -t1 -c8 -d"$1s" --timeout 5s "http://127.0.0.1:$port$bench_path" >"$2" 2>&1 ||
        { echo "bench-node: wrk failed:" >&2; cat "$2" >&2; exit 1; }
    if [ $# -ge 3 ]; then
        awk -v t="$(( $(ticks) - t0 ))" -v hz="$hz" '/ requests in / { print t / hz * 1e6 / $1 }' "$2" >>"$3"
    fi
    awk '/^Requests\/sec:/ { print $2 }' "$2"
}

# dump_loop SECS OUT: GET /coverage on the socket every 100 ms for SECS s,
# one connection per dump; appends each dump's time (ms, request to last
# byte) to OUT.
dump_loop() {
    node - "$socket" "$1" "$2" <<'EOF'
const http = require('node:http');
const fs = require('node:fs');
const [socketPath, secs, out] = process.argv.slice(2);
const end = Date.now() + Number(secs) * 1000;
const times = [];
function one() {
  if (Date.now() >= end) {
    fs.appendFileSync(out, times.map((t) => `${t.toFixed(3)}\n`).join(''));
    return;
  }
  const t0 = process.hrtime.bigint();
  const next = () => setTimeout(one, Math.max(0, 100 - Number(process.hrtime.bigint() - t0) / 1e6));
  http.get({ socketPath, path: '/coverage', agent: false }, (res) => {
    res.resume();
    res.on('end', () => {
      if (res.statusCode === 200) times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      else console.error(`bench-node: a dump answered ${res.statusCode}`);
      next();
    });
  }).on('error', (err) => {
    console.error(`bench-node: a dump failed: ${err.message}`);
    next();
  });
}
one();
EOF
}

echo "bench-node: node $(node --version), $rounds x (without the hook, with it, with it and a dump every 100 ms, NODE_V8_COVERAGE), ${load_secs} s each"
for k in off on dumps v8 w_off w_on w_dumps; do
    for m in rps cpu rss; do : >"$work/${m}_$k"; done
done
: >"$work/t_dumps"
: >"$work/t_w_dumps"
# load_run NAME MODE ROUND: one load of the app started as MODE.
load_run() {
    start_app "$work/$1-$3" "$2"
    wrk_run 1 "$work/$1-$3/warmup" >/dev/null
    wrk_run "$load_secs" "$work/$1-$3/wrk" "$work/cpu_$1" >>"$work/rps_$1"
    rss_kib >>"$work/rss_$1"
    stop_app
}
# dumps_run NAME ROUND: one load of the app with the hook, dumped every 100 ms.
dumps_run() {
    start_app "$work/$1-$2" hook
    wrk_run 1 "$work/$1-$2/warmup" >/dev/null
    dump_loop "$load_secs" "$work/t_$1" &
    lpid=$!
    wrk_run "$load_secs" "$work/$1-$2/wrk" "$work/cpu_$1" >>"$work/rps_$1"
    wait "$lpid"
    rss_kib >>"$work/rss_$1"
    stop_app
}
for r in $(seq "$rounds"); do
    load_run off off "$r"
    load_run on hook "$r"
    load_run v8 v8 "$r"
    dumps_run dumps "$r"
done
if [ "$workers" = 1 ]; then
    echo "bench-node: worker threads, $rounds x (without the hook, with it, with it and a dump every 100 ms)"
    use_app "$root/fixtures/node/workers/server.js" "/square?n=50" '^2500 even \(thread [0-9]+\)$'
    for r in $(seq "$rounds"); do
        load_run w_off off "$r"
        load_run w_on hook "$r"
        dumps_run w_dumps "$r"
    done
fi

# children_cpu_ms FILE: the CPU time (user + system) of the calling shell's
# children so far, from `times` written to FILE (`times` in a command
# substitution would count the substitution's children).
children_cpu_ms() { tail -1 "$1" | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); print (u[1] * 60 + u[2] + s[1] * 60 + s[2]) * 1000 }'; }

# start_cost HOOK(0|1): "<median wall ms> <mean CPU ms>" of $starts runs of `node -e 0`.
start_cost() {
    local dir="$work/starts-$1" t0 t1
    mkdir -p "$dir"
    : >"$dir/times"
    times >"$dir/cpu0"
    for _ in $(seq "$starts"); do
        t0=$(date +%s%N)
        if [ "$1" = 1 ]; then
            LIVECOV_DIR="$dir/cov" NODE_OPTIONS="--require $hook" node -e 0
        else
            node -e 0
        fi
        t1=$(date +%s%N)
        echo $(((t1 - t0) / 1000)) >>"$dir/times"
    done
    times >"$dir/cpu1"
    echo "$(median <"$dir/times") $(children_cpu_ms "$dir/cpu1") $(children_cpu_ms "$dir/cpu0")" | awk -v n="$starts" '{ printf "%.1f ms | %.1f ms", $1 / 1000, ($2 - $3) / n }'
}
start_off=$(start_cost 0)
start_on=$(start_cost 1)

echo
echo "GET /items?n=3 on fixtures/node/http/server.js, wrk -t1 -c8 -d${load_secs}s, median of $rounds rounds; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
header() {
    echo "| run | requests/s | vs without | CPU per request | vs without | VmRSS at the end |"
    echo "|---|---:|---:|---:|---:|---:|"
}
header
row() { # row NAME KEY BASELINE_KEY
    awk -v n="$1" -v v="$(median <"$work/rps_$2")" -v b="$(median <"$work/rps_$3")" -v c="$(median <"$work/cpu_$2")" -v cb="$(median <"$work/cpu_$3")" \
        -v m="$(median <"$work/rss_$2")" \
        'BEGIN { printf "| %s | %.0f | %+.1f%% | %.1f µs | %+.1f%% | %.1f MiB |\n", n, v, (v / b - 1) * 100, c, (c / cb - 1) * 100, m / 1024 }'
}
row "without the hook" off off
row "with the hook" on off
row "with the hook, /coverage every 100 ms" dumps off
row "NODE_V8_COVERAGE (as under c8), no hook" v8 off
dump_times() { # dump_times KEY
    echo
    echo "| measure | value |"
    echo "|---|---:|"
    echo "| dumps during the load | $(wc -l <"$work/t_$1") |"
    echo "| dump time, median | $(median <"$work/t_$1" | awk '{ printf "%.1f ms", $1 }') |"
    echo "| dump time, p95 | $(p95 <"$work/t_$1" | awk '{ printf "%.1f ms", $1 }') |"
}
dump_times dumps
if [ "$workers" = 1 ]; then
    echo
    echo "GET /square?n=50 on fixtures/node/workers/server.js (a pool of two worker threads), same load"
    echo
    header
    row "without the hook" w_off w_off
    row "with the hook" w_on w_off
    row "with the hook, /coverage every 100 ms" w_dumps w_off
    dump_times w_dumps
fi
echo
echo "| \`node -e 0\`, $starts runs | wall, median | CPU, mean |"
echo "|---|---:|---:|"
echo "| without the hook | $start_off |"
echo "| with the hook | $start_on |"
