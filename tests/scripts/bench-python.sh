#!/usr/bin/env bash
# Benchmarks the Python hook (hooks/python) on every Python it is tested on
# (the venvs of tests/scripts/deps-python.sh: the system's python3, 3.12 and
# 3.13), in one run, and prints markdown tables with the versions side by
# side:
#
# 1. Start: `python -c pass` without the hook's variables and with
#    LIVECOV_DIR set (coverage.py imported and started, the socket bound),
#    median of 10.
# 2. Requests/s of the Flask fixture (fixtures/python, GET /price/pear) under
#    gunicorn with one sync worker, wrk -t1 -c4 on 127.0.0.1 for
#    BENCH_PYTHON_LOAD_SECS (default 10) s: without the hook, under
#    `coverage run --branch` (coverage.py's tracer without the hook: what
#    measuring costs by itself), with the hook, and with the hook while a
#    loop fetches /coverage from the worker's socket every 100 ms (the
#    worker's CPU time then includes the dumps'); BENCH_PYTHON_ROUNDS
#    (default 3) rounds, each round every version and configuration in
#    turn (so a busy spell of the machine hits them alike), the median of
#    each. Also the worker's CPU time per request (/proc/PID/stat), steadier
#    than requests/s on a busy machine.
# 3. Dumps and the pause they cause: the app in one process under the hook,
#    one thread serving requests through Flask's test client as fast as it
#    can, while the main thread takes 20 dumps over the socket. The first dump
#    (coverage.py parses every measured file) and the median of the others,
#    and the longest gap between two requests of the serving thread without
#    dumps, during the first dump and during the others: how long a dump can
#    hold the program up. Once with the default scope (the app's files), once
#    with LIVECOV_IGNORE='^$' (the stdlib, Flask, Werkzeug, Jinja... too).
#
# Uses the venvs of tests/scripts/deps-python.sh (made if needed). Every loop
# is bounded in count and time; only loopback addresses. Not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
load_secs=${BENCH_PYTHON_LOAD_SECS:-10}
rounds=${BENCH_PYTHON_ROUNDS:-3}
source "$root/tests/scripts/bench-common.sh"

install_tools wrk=wrk curl=curl
tests/scripts/deps-python.sh
venvs=("$root/target/python-venv" "$root/target/python-venv-3.12" "$root/target/python-venv-3.13")
versions=()
for venv in "${venvs[@]}"; do
    versions+=("$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')")
done
for name in $(compgen -e); do
    case "$name" in LIVECOV_*) unset "$name" ;; esac
done
export PYTHONDONTWRITEBYTECODE=1

work="$root/target/bench-python"
rm -rf "$work"
mkdir -p "$work"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# -- 1. start -------------------------------------------------------------------
start_ms() { # start_ms VENV [ENV...]: median wall time of `python -c pass`, in ms
    local venv=$1
    shift
    /usr/bin/env "$@" "$venv/bin/python" -c pass # warm the page cache
    for _ in $(seq 10); do
        s=$(date +%s%N)
        /usr/bin/env "$@" "$venv/bin/python" -c pass
        e=$(date +%s%N)
        echo $(( (e - s) / 1000000 ))
    done | median
}
declare -A result # result[KEY-VERSION]: every number the tables print
for i in "${!venvs[@]}"; do
    result[start_off-$i]=$(start_ms "${venvs[$i]}")
    result[start_on-$i]=$(start_ms "${venvs[$i]}" LIVECOV_DIR="$work/start-cov-$i")
done

# -- 2. requests/s under gunicorn ---------------------------------------------------
start_gunicorn() { # start_gunicorn NAME COMMAND...: COMMAND + gunicorn's options, in the background, logging to NAME.log
    local name=$1
    shift
    (cd fixtures/python && exec "$@" --workers 1 --worker-class sync \
        --no-control-socket --bind 127.0.0.1:0 app:app >"$work/$name.log" 2>&1) &
    pids+=($!)
}
port_of() { # port_of NAME: the port gunicorn NAME listens on, once it answers
    local port
    for _ in $(seq 200); do
        port=$(sed -n 's/.*Listening at: http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/$1.log")
        if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/" >/dev/null; then
            echo "$port"
            return
        fi
        sleep 0.05
    done
    echo "bench-python: gunicorn ($1) did not start:" >&2
    cat "$work/$1.log" >&2
    exit 1
}
worker_of() { # worker_of MASTER: the pid of the master's (one) worker
    local pid
    for _ in $(seq 200); do
        pid=$(ps -o pid= --ppid "$1" | head -1 | tr -d ' ')
        [ -n "$pid" ] && { echo "$pid"; return; }
        sleep 0.05
    done
    echo "bench-python: no worker under $1" >&2
    exit 1
}
ticks=$(getconf CLK_TCK)
cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; } # user + system time, in ticks
wrk_run() { # wrk_run PORT WORKER SECS OUT: prints "requests/s CPU-microseconds-per-request"
    local before after
    before=$(cpu_of "$2")
    wrk -t1 -c4 -d"$3s" --timeout 5s "http://127.0.0.1:$1/price/pear?region=us" >"$4" 2>&1 ||
        { echo "bench-python: wrk failed:" >&2; cat "$4" >&2; exit 1; }
    after=$(cpu_of "$2")
    awk -v cpu=$((after - before)) -v hz="$ticks" '
        / requests in / { n = $1 }
        /Requests\/sec/ { rps = $2 }
        END { printf "%s %.0f\n", rps, cpu / hz * 1e6 / n }' "$4"
}

declare -A port worker socket_of
for i in "${!venvs[@]}"; do
    venv=${venvs[$i]}
    start_gunicorn "off-$i" "$venv/bin/gunicorn"
    master_off=${pids[-1]}
    start_gunicorn "on-$i" env LIVECOV_DIR="$work/gunicorn-cov-$i" "$venv/bin/gunicorn"
    master_on=${pids[-1]}
    # coverage.py alone, for comparison: the worker inherits the master's tracer at the fork.
    start_gunicorn "coverage-$i" "$venv/bin/coverage" run --branch --data-file="$work/coverage-run-$i.data" -m gunicorn
    master_coverage=${pids[-1]}
    for config in off on coverage; do
        master=master_$config
        port[$config-$i]=$(port_of "$config-$i")
        worker[$config-$i]=$(worker_of "${!master}")
    done
    for _ in $(seq 200); do
        for s in "$work/gunicorn-cov-$i"/sockets/*.sock; do
            [ -S "$s" ] || continue
            ppid=$(curl -s --unix-socket "$s" localhost/health | sed -n 's/.*"ppid": \([0-9]*\).*/\1/p')
            [ "$ppid" = "$master_on" ] && socket_of[$i]=$s
        done
        [ -n "${socket_of[$i]:-}" ] && break
        sleep 0.05
    done
    [ -n "${socket_of[$i]:-}" ] || { echo "bench-python: no worker socket in $work/gunicorn-cov-$i" >&2; exit 1; }
    for config in off on coverage; do
        wrk_run "${port[$config-$i]}" "${worker[$config-$i]}" 2 "$work/warmup-$config-$i" >/dev/null
    done
done
for r in $(seq "$rounds"); do
    for i in "${!venvs[@]}"; do
        for config in off coverage on; do
            wrk_run "${port[$config-$i]}" "${worker[$config-$i]}" "$load_secs" "$work/wrk-$config-$i-$r" >>"$work/$config-$i"
        done
        (
            end=$((SECONDS + load_secs + 2))
            while [ $SECONDS -lt $end ]; do
                curl -s --max-time 5 --unix-socket "${socket_of[$i]}" localhost/coverage >/dev/null || true
                sleep 0.1
            done
        ) &
        dumper=$!
        wrk_run "${port[on-$i]}" "${worker[on-$i]}" "$load_secs" "$work/wrk-dumps-$i-$r" >>"$work/dumps-$i"
        kill "$dumper" 2>/dev/null || true
        wait "$dumper" 2>/dev/null || true
    done
done
for i in "${!venvs[@]}"; do
    for config in off coverage on dumps; do
        result[rps_$config-$i]=$(cut -d' ' -f1 "$work/$config-$i" | median)
        result[cpu_$config-$i]=$(cut -d' ' -f2 "$work/$config-$i" | median)
    done
done

# -- 3. dumps and pauses --------------------------------------------------------------
cat >"$work/pause.py" <<'EOF'
# The app served by one thread through Flask's test client, dumps taken by
# the main thread over the hook's socket; prints one JSON line of timings.
import json, os, socket, statistics, sys, threading, time

sys.path.insert(0, sys.argv[1])
from app import app

client = app.test_client()
sockets = os.path.join(os.environ["LIVECOV_DIR"], "sockets")
path = os.path.join(sockets, next(f for f in os.listdir(sockets) if f.startswith(f"python-{os.getpid()}-")))

def dump():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    started = time.perf_counter()
    s.sendall(b"GET /coverage HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    size = 0
    while chunk := s.recv(1 << 16):
        size += len(chunk)
    s.close()
    return time.perf_counter() - started, size

stop = False
stamps = []
def serve():
    while not stop:
        client.get("/price/pear?region=us")
        stamps.append(time.perf_counter())

def worst_gap(since, until):
    times = [t for t in stamps if since <= t <= until]
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)

thread = threading.Thread(target=serve)
thread.start()
time.sleep(0.5)
t0 = time.perf_counter()
time.sleep(1.0)
t1 = time.perf_counter()
first, size = dump()
t2 = time.perf_counter()
warm = []
for _ in range(19):
    warm.append(dump()[0])
    time.sleep(0.05)
t3 = time.perf_counter()
stop = True
thread.join()
print(json.dumps({
    "bytes": size, "first_ms": first * 1e3, "warm_ms": statistics.median(warm) * 1e3,
    "gap_none_ms": worst_gap(t0, t1) * 1e3, "gap_first_ms": worst_gap(t1, t2) * 1e3,
    "gap_warm_ms": worst_gap(t2, t3) * 1e3,
    "median_request_ms": statistics.median(b - a for a, b in zip(stamps, stamps[1:])) * 1e3,
}))
EOF
for i in "${!venvs[@]}"; do
    result[pause_default-$i]=$(LIVECOV_DIR="$work/pause-cov-$i" "${venvs[$i]}/bin/python" "$work/pause.py" "$root/fixtures/python")
    result[pause_all-$i]=$(LIVECOV_DIR="$work/pause-all-cov-$i" LIVECOV_IGNORE='^$' "${venvs[$i]}/bin/python" "$work/pause.py" "$root/fixtures/python")
done

field() { echo "$1" | "${venvs[0]}/bin/python" -c "import json, sys; print(f'{json.load(sys.stdin)[\"$2\"]:.${3:-1}f}')"; }

pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
# header TITLE...: a table's header row with one column per version after TITLE's.
header() {
    local row="|" rule="|"
    for title in "$@"; do row+=" $title |"; rule+="---|"; done
    for v in "${versions[@]}"; do row+=" Python $v |"; rule+="---:|"; done
    echo "$row"
    echo "$rule"
}
# row LABEL KEY: LABEL, then result[KEY-i] of each version.
row() {
    local line="| $1 |"
    for i in "${!venvs[@]}"; do line+=" ${result[$2-$i]} |"; done
    echo "$line"
}

echo
echo "1. Start: python -c pass, median of 10, ms"
echo
header "hook"
row "off (LIVECOV_DIR unset)" start_off
row "on (LIVECOV_DIR set)" start_on
echo
echo "2. Flask fixture GET /price/pear, gunicorn 1 sync worker, wrk -t1 -c4 -d${load_secs}s on 127.0.0.1, median of $rounds"
echo
labels=(off "no hook" coverage "no hook, coverage run --branch (its tracer alone)" on "hook" dumps "hook, /coverage every 100 ms")
echo "Requests/s:"
echo
header ""
for ((k = 0; k < ${#labels[@]}; k += 2)); do row "${labels[k + 1]}" "rps_${labels[k]}"; done
echo
echo "The worker's CPU time per request, us (and vs. no hook):"
echo
header ""
for ((k = 0; k < ${#labels[@]}; k += 2)); do
    line="| ${labels[k + 1]} |"
    for i in "${!venvs[@]}"; do
        line+=" ${result[cpu_${labels[k]}-$i]} ($(pct "${result[cpu_${labels[k]}-$i]}" "${result[cpu_off-$i]}")) |"
    done
    echo "$line"
done
echo
echo "3. Dumps and the pause of a thread serving requests (one process, 20 dumps), ms"
echo
header "scope" ""
for scope in default all; do
    if [ $scope = default ]; then label="app files (default)"; else label="everything (LIVECOV_IGNORE='^\$')"; fi
    for measure in "LCOV bytes:bytes:0" "first dump:first_ms:1" "warm dump (median):warm_ms:1" "request (median):median_request_ms:2" \
        "longest gap, no dump:gap_none_ms:1" "longest gap, first dump:gap_first_ms:1" "longest gap, warm dumps:gap_warm_ms:1"; do
        IFS=: read -r title key digits <<<"$measure"
        line="| $label | $title |"
        for i in "${!venvs[@]}"; do line+=" $(field "${result[pause_$scope-$i]}" "$key" "$digits") |"; done
        echo "$line"
    done
done
