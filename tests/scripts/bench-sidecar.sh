#!/usr/bin/env bash
# Benchmarks merging and fan-out, side by side in one run:
#
# 1. Merge: 64 LCOV reports of the large fixture (fixtures/large, the
#    .profraw files bench.sh leaves in target/fixtures/large/bench/profraw/,
#    each converted alone with `livecov convert`, the 11 reports cycled to
#    make 64 files) merged by
#      livecov merge F1 ... F64 -o out                (release build)
#      lcov -a F1 -a F2 ... -a F64 -o out             (Debian's lcov, Perl)
#      lcov-merge-bench -o out F1 ... F64             (the `lcov` crate's
#                                                      Report::merge, fixtures/lcov-merge-bench)
#    Wall time is the median of BENCH_RUNS runs (default 3, the tools
#    interleaved, after one untimed warm-up of livecov's and the crate's);
#    peak RSS is /usr/bin/time's %M of the same runs, median.
# 2. Fan-out: `livecov collect` (one round of requests to every target, their
#    merge, the files written) over 64 replicas of fixtures/service with the
#    agent (127.0.0.2 .. 127.0.0.65, the agent on LIVECOV_LISTEN=127.0.0.N:PORT,
#    one port shared, LIVECOV_DIR a scratch folder each) against over 1
#    replica: the median of BENCH_RUNS rounds after one warm-up round (every
#    agent's cold first dump), timed around the whole command, and the
#    manifest's own duration_ms. 64 replicas are asked with the default
#    --parallelism (16) and with --parallelism 64.
#
# Every loop is bounded; only loopback addresses; every process started here
# is ended on exit. Needs tests/scripts/bench.sh to have run once (the
# .profraw files); run from anywhere, or at the end of `make bench`. Not
# part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-3}
[ "$runs" -gt 3 ] || runs=3   # the median of at least 3
replicas=${BENCH_SIDECAR_REPLICAS:-64}
reports=${BENCH_SIDECAR_REPORTS:-64}
[ "$replicas" -ge 1 ] && [ "$replicas" -le 250 ] || { echo "bench-sidecar: BENCH_SIDECAR_REPLICAS must be 1..250" >&2; exit 2; }

# --- tools -------------------------------------------------------------------
source "$root/tests/scripts/bench-common.sh"
install_tools /usr/bin/time=time lcov=lcov curl=curl ss=iproute2

# --- builds --------------------------------------------------------------------
echo "bench-sidecar: building livecov (release)"
"${clean_env[@]}" cargo build --release --quiet -p livecov-cli
livecov="$root/target/release/livecov"

echo "bench-sidecar: building fixtures/lcov-merge-bench (the lcov crate, release)"
crate_target="$root/target/fixtures/lcov-merge-bench"
"${clean_env[@]}" CARGO_TARGET_DIR="$crate_target" \
    cargo build --release --quiet --locked --manifest-path fixtures/lcov-merge-bench/Cargo.toml
crate_merge="$crate_target/release/lcov-merge-bench"

large="$root/target/fixtures/large/$host/debug/large"
profraws=()
if [ -d "$root/target/fixtures/large/bench/profraw" ]; then
    profraws=("$root"/target/fixtures/large/bench/profraw/*.profraw)
fi
if [ ! -x "$large" ] || [ "${#profraws[@]}" -eq 0 ] || [ ! -e "${profraws[0]}" ]; then
    echo "bench-sidecar: $large or its .profraw files are missing: run tests/scripts/bench.sh first" >&2
    exit 1
fi

work="$root/target/bench-sidecar"
rm -rf "$work"
mkdir -p "$work/reports" "$work/out"
echo "bench-sidecar: building fixtures/service with -C instrument-coverage"
service="$work/service-bin"
service_copy "$service"

# --- helpers ---------------------------------------------------------------------
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# summary LCOV: "DA records, lines hit, sum of DA counts" (a sanity check that
# the tools merged to the same numbers).
summary() {
    awk -F'[:,]' '/^DA:/ { n++; if ($3 > 0) h++; s += $3 } END { printf "%d %d %.0f\n", n, h, s }' "$1"
}

# timed NAME OUT CMD...: runs CMD under /usr/bin/time; appends the wall time
# (ms, measured around it) to $work/t_NAME and the peak RSS (KiB) to $work/m_NAME.
timed() {
    local name=$1 s e
    shift
    s=$(now_ns)
    if ! /usr/bin/time -f %M -o "$work/rss" "$@" >"$work/stdout-$name" 2>"$work/stderr-$name"; then
        echo "bench-sidecar: $name failed:" >&2
        tail -5 "$work/stderr-$name" >&2
        exit 1
    fi
    e=$(now_ns)
    echo "$(((e - s) / 1000))" | awk '{ printf "%.3f\n", $1 / 1000 }' >>"$work/t_$name"
    tail -1 "$work/rss" >>"$work/m_$name"
}

# --- 1: merge ----------------------------------------------------------------------
echo "bench-sidecar: converting ${#profraws[@]} .profraw files one by one (livecov convert), $reports reports cycling them"
singles=()
for i in "${!profraws[@]}"; do
    out="$work/single-$(printf %02d "$i").lcov"
    "$livecov" convert --binary "$large" --profraw "${profraws[$i]}" -o "$out"
    singles+=("$out")
done
inputs=()
for i in $(seq 0 $((reports - 1))); do
    f="$work/reports/r-$(printf %03d "$i").lcov"
    cp "${singles[$((i % ${#singles[@]}))]}" "$f"
    inputs+=("$f")
done
lcov_args=()
for f in "${inputs[@]}"; do lcov_args+=(-a "$f"); done
# Debian's lcov (1.16) takes llvm-cov's LCOV as it is: no --ignore-errors
# flags; --quiet only silences its per-file progress lines.
lcov_extra=(--quiet)
if lcov --version | grep -qE 'version (2|[3-9])\.'; then
    # lcov 2.x checks more (e.g. inconsistent function ends) than llvm-cov's output satisfies.
    lcov_extra+=(--ignore-errors inconsistent,inconsistent,format,format,unsupported,unsupported)
fi

echo "bench-sidecar: warm-up (untimed) of livecov merge and the lcov crate; cat of the inputs"
cat "${inputs[@]}" >/dev/null
"$livecov" merge "${inputs[@]}" -o "$work/out/livecov.lcov" >/dev/null 2>&1
"$crate_merge" -o "$work/out/crate.lcov" "${inputs[@]}"

echo "bench-sidecar: $runs timed runs of each, interleaved (lcov -a takes a while)"
: >"$work/t_livecov"; : >"$work/t_lcov"; : >"$work/t_crate"
: >"$work/m_livecov"; : >"$work/m_lcov"; : >"$work/m_crate"
for _ in $(seq "$runs"); do
    timed livecov "$livecov" merge "${inputs[@]}" -o "$work/out/livecov.lcov"
    timed lcov lcov "${lcov_extra[@]}" "${lcov_args[@]}" -o "$work/out/lcov.lcov"
    timed crate "$crate_merge" -o "$work/out/crate.lcov" "${inputs[@]}"
done

# --- 2: fan-out ----------------------------------------------------------------------
# One port, free on every 127.0.0.N we use (nothing listens on it on any address).
port=""
for _ in $(seq 50); do
    p=$((20000 + RANDOM % 30000))
    if ! ss -Htln | awk '{ print $4 }' | grep -q ":$p\$"; then port=$p; break; fi
done
[ -n "$port" ] || { echo "bench-sidecar: no free port" >&2; exit 1; }

ips=()
for n in $(seq 2 $((replicas + 1))); do ips+=("127.0.0.$n"); done
echo "bench-sidecar: starting $replicas replicas of fixtures/service on ${ips[0]} .. ${ips[-1]}, agents on port $port"
for ip in "${ips[@]}"; do
    d="$work/replicas/$ip"
    mkdir -p "$d"
    "${clean_env[@]}" LIVECOV_DIR="$d/cov" LIVECOV_LISTEN="$ip:$port" LIVECOV_DEMANGLE=0 \
        LLVM_PROFILE_FILE="$d/exit-%p.profraw" \
        "$service" --addr "$ip:0" >"$d/stdout" 2>"$d/stderr" </dev/null &
    pids+=("$!")
done
agent_up() { (exec 3<>"/dev/tcp/$1/$port") 2>/dev/null; }
for ip in "${ips[@]}"; do
    d="$work/replicas/$ip"
    if ! wait_for 300 grep -q '^listening on ' "$d/stdout" || ! wait_for 300 agent_up "$ip"; then
        echo "bench-sidecar: the replica on $ip did not start; stderr:" >&2
        tail -5 "$d/stderr" >&2
        exit 1
    fi
    # A little traffic, so every replica has counts of its own.
    sport=$(sed -n 's/^listening on .*://p' "$d/stdout")
    curl -sS --max-time 10 -o /dev/null "http://$ip:$sport/fib?n=15" || echo "bench-sidecar: GET /fib on $ip failed" >&2
done

targets_all=()
for ip in "${ips[@]}"; do targets_all+=(--target "http://$ip:$port"); done
targets_one=(--target "http://${ips[0]}:$port")

# collect_round NAME ARGS...: one `livecov collect` into a fresh folder; timed
# (wall ms to $work/t_NAME, the manifest's duration_ms to $work/d_NAME);
# checks that every target answered.
collect_round() {
    local name=$1 out="$work/collect/$1" s e want
    shift
    rm -rf "$out"
    want=$(printf '%s\n' "$@" | grep -c '^--target$')
    s=$(now_ns)
    if ! "$livecov" collect "$@" --timeout 120 -o "$out" >"$work/collect-$name.log" 2>&1; then
        echo "bench-sidecar: livecov collect ($name) failed:" >&2
        tail -5 "$work/collect-$name.log" >&2
        exit 1
    fi
    e=$(now_ns)
    echo "$(((e - s) / 1000))" | awk '{ printf "%.3f\n", $1 / 1000 }' >>"$work/t_$name"
    sed -n 's/^  "duration_ms": \([0-9]*\),*$/\1/p' "$out/manifest.json" | head -1 >>"$work/d_$name"
    local got
    got=$(sed -n 's/^  "instances": \([0-9]*\),*$/\1/p' "$out/manifest.json" | head -1)
    [ "$got" = "$want" ] || { echo "bench-sidecar: collect ($name): $got instances of $want targets" >&2; exit 1; }
}

echo "bench-sidecar: warm-up round over all $replicas replicas (every agent's cold first dump)"
collect_round warmup "${targets_all[@]}" --parallelism "$replicas"
echo "bench-sidecar: $runs timed rounds of each, interleaved"
for name in one all16 allN; do : >"$work/t_$name"; : >"$work/d_$name"; done
for _ in $(seq "$runs"); do
    collect_round one "${targets_one[@]}"
    collect_round all16 "${targets_all[@]}"
    collect_round allN "${targets_all[@]}" --parallelism "$replicas"
done
echo "bench-sidecar: load average after the runs: $(load) on $(nproc) CPUs"
cleanup
pids=()

# --- tables -----------------------------------------------------------------------------
echo
distinct=$((reports < ${#singles[@]} ? reports : ${#singles[@]}))
echo "1. merge of $reports LCOV reports of fixtures/large ($(stat -c %s "${inputs[0]}") bytes, $(grep -c '^SF:' "${inputs[0]}") files each; $distinct distinct, cycled), median of $runs runs"
printf "%-52s %10s %14s %9s  %s\n" "tool" "wall ms" "peak RSS MiB" "vs lcov" "DA records / lines hit / sum of counts"
t_lcov=$(median <"$work/t_lcov")
mrow() { # mrow LABEL NAME
    awk -v label="$1" -v t="$(median <"$work/t_$2")" -v m="$(median <"$work/m_$2")" -v ref="$t_lcov" -v s="$(summary "$work/out/$2.lcov")" \
        'BEGIN { printf "%-52s %10.1f %14.1f %8.2fx  %s\n", label, t, m / 1024, ref / t, s }'
}
mrow "livecov merge" livecov
mrow "lcov -a ... (Debian lcov $(lcov --version | sed -n 's/.*version //p'), ${lcov_extra[*]})" lcov
mrow "lcov crate $(sed -n '/^name = "lcov"$/{n;s/version = "\(.*\)"/\1/p}' fixtures/lcov-merge-bench/Cargo.lock) Report::merge" crate

echo
echo "2. fan-out: livecov collect over replicas of fixtures/service (agent on TCP, 127.0.0.N:$port), median of $runs rounds after a warm-up round"
printf "%-52s %10s %16s %9s\n" "targets" "wall ms" "duration_ms" "vs one"
t_one=$(median <"$work/t_one")
frow() { # frow LABEL NAME
    awk -v label="$1" -v t="$(median <"$work/t_$2")" -v d="$(median <"$work/d_$2")" -v ref="$t_one" \
        'BEGIN { printf "%-52s %10.1f %16.1f %8.2fx\n", label, t, d, t / ref }'
}
frow "1 replica" one
frow "$replicas replicas (--parallelism 16, the default)" all16
frow "$replicas replicas (--parallelism $replicas)" allN
for row in "all16:--parallelism 16" "allN:--parallelism $replicas"; do
    name=${row%%:*}
    awk -v n="$replicas replicas, ${row#*:}" -v a="$(median <"$work/t_$name")" -v o="$t_one" \
        'BEGIN { r = a / o; printf "%s: %.2fx the time of one replica (goal: under 2x): %s\n", n, r, (r < 2 ? "met" : "NOT met") }'
done
