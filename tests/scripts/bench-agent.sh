#!/usr/bin/env bash
# Benchmarks the in-process agent (livecov::start()) in one run, side by side:
#
# 1. Warm dumps: `GET /coverage` on the large instrumented program
#    (fixtures/large built with --features agent, `large serve`: bench.sh's
#    workload in one process, which then stays alive), the median and p95 of
#    BENCH_AGENT_DUMPS dumps after the first, against LLVM 22's
#      llvm-profdata merge -sparse snap.profraw -o x.profdata
#      && llvm-cov export -format=lcov BIN -instr-profile x.profdata
#    over a snapshot of the same process (`GET /coverage?format=profraw`),
#    only the two LLVM steps timed, median of BENCH_RUNS runs (default 5)
#    after an untimed warm-up. llvm-cov gets -ignore-filename-regex for what
#    the agent leaves out (livecov::agent::DEFAULT_IGNORE and agent-rust/src/),
#    so both write the same report; the full report is timed too. Then says
#    whether the agent's LCOV (LIVECOV_DEMANGLE=0) equals llvm-cov's.
# 2. The cold first dump after start, and the agent's resident memory
#    (VmRSS of the process before the first dump and after the others).
# 3. Requests/s of fixtures/service (one connection at a time) under wrk on
#    127.0.0.1 for BENCH_AGENT_LOAD_SECS (default 10) s, once without dumps
#    and once while a loop fetches /coverage over the Unix socket every
#    100 ms; BENCH_AGENT_ROUNDS (default 3) alternating pairs, the median of
#    each (one pair is at the mercy of whatever else the machine runs); and
#    the service's CPU time per request (its /proc stat, agent included),
#    and the share of the service's CPU time its agent threads took (their
#    schedstat): figures that other work on the machine skews far less.
#
# Both programs are built as users build them: `cargo build` (debug) with
# -C instrument-coverage, the agent compiled into them as a dependency;
# fixtures/service with its dependencies (the agent among them) optimized,
# as docs/agent.md recommends, fixtures/large without (its dependencies are
# what it reports).
# Every loop is bounded in count and time; only loopback addresses. Run from
# anywhere, or at the end of `make bench`; not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-5}
dumps=${BENCH_AGENT_DUMPS:-20}
load_secs=${BENCH_AGENT_LOAD_SECS:-10}
rounds=${BENCH_AGENT_ROUNDS:-3}
dump_period_ms=100

# --- tools -------------------------------------------------------------------
source "$root/tests/scripts/bench-common.sh"
install_tools wrk=wrk curl=curl python3=python3

# --- builds --------------------------------------------------------------------
# With --target, RUSTFLAGS reach the programs and their libraries (the agent
# too, as in any coverage build) but not build scripts and proc macros.
echo "bench-agent: building fixtures/large --features agent with -C instrument-coverage"
large_target="$root/target/fixtures/large-agent"   # not bench.sh's: other features
"${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$large_target" \
    cargo build --quiet --locked --target "$host" --features agent "${optimized_dependencies[@]}" \
    --manifest-path fixtures/large/Cargo.toml
large="$large_target/$host/debug/large"

work="$root/target/bench-agent"
rm -rf "$work"
mkdir -p "$work"
echo "bench-agent: building fixtures/service with -C instrument-coverage"
service="$work/service-bin"
service_copy "$service"

# --- helpers ---------------------------------------------------------------------
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mem_kib() { # mem_kib PID: VmRSS RssAnon VmHWM, KiB
    awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } /^VmHWM:/ { h = $2 } END { print r, a, h }' "/proc/$1/status"
}
alive() { kill -0 "$1" 2>/dev/null; }

# dump SOCKET PATH OUT: one request to the agent; prints its time in ms
# (curl's time_total: connect to last byte).
dump() {
    local t
    if ! t=$(curl -sS --fail-with-body --max-time 120 --unix-socket "$1" -o "$3" -w '%{time_total}' "http://localhost$2"); then
        echo "bench-agent: GET $2 failed: $(head -c 300 "$3" 2>/dev/null)" >&2
        return 1
    fi
    awk -v t="$t" 'BEGIN { printf "%.3f\n", t * 1000 }'
}


# forget PID: a process that ended is no longer the cleanup's.
forget() {
    local p kept=()
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}

# stop PID: waits up to 10 s for it to end, then SIGTERM, then SIGKILL.
stop() {
    local pid=$1
    wait_for 100 eval "! alive $pid" || { kill -TERM "$pid" 2>/dev/null || true; wait_for 50 eval "! alive $pid" || kill -KILL "$pid" 2>/dev/null || true; }
    wait "$pid" 2>/dev/null || true
    forget "$pid"
}

# start_large NAME [ENV=VALUE...]: `large serve` with the agent, its stdin a
# FIFO this shell holds open (closing it ends the process). Sets large_pid,
# large_fd, large_dir, large_sock.
start_large() {
    local name=$1
    shift
    large_dir="$work/$name"
    mkdir -p "$large_dir"
    mkfifo "$large_dir/stdin"
    "${clean_env[@]}" LIVECOV_DIR="$large_dir/cov" LLVM_PROFILE_FILE="$large_dir/exit-%p.profraw" "$@" \
        "$large" serve --inputs "$root/fixtures/large/inputs" --scratch "$large_dir/scratch" \
        <"$large_dir/stdin" >"$large_dir/stdout" 2>"$large_dir/stderr" &
    large_pid=$!
    pids+=("$large_pid")
    exec {large_fd}<>"$large_dir/stdin"   # read-write: never blocks
    if ! wait_for 1200 grep -qx 'large serve: ready' "$large_dir/stdout"; then
        echo "bench-agent: large serve did not get ready; stderr:" >&2
        tail -5 "$large_dir/stderr" >&2
        exit 1
    fi
    large_sock=$(ls "$large_dir"/cov/sockets/rust-"$large_pid"-*.sock)
}

stop_large() {
    exec {large_fd}>&-
    stop "$large_pid"
}

# --- 1 and 2: the large program --------------------------------------------------
# measure_large NAME [ENV=VALUE...]: cold dump, RSS, warm dumps. Leaves the
# process running.
measure_large() {
    local name=$1 i
    shift
    start_large "$name" "$@"
    mem_kib "$large_pid" >"$large_dir/rss_ready"
    dump "$large_sock" /coverage "$large_dir/cold.lcov" >"$large_dir/t_cold"
    : >"$large_dir/t_warm"
    for i in $(seq "$dumps"); do
        dump "$large_sock" /coverage "$large_dir/warm.lcov" >>"$large_dir/t_warm"
    done
    mem_kib "$large_pid" >"$large_dir/rss_after"
}

echo "bench-agent: load average before the runs: $(load) on $(nproc) CPUs (other work on the machine skews every time below)"
echo "bench-agent: large serve (LIVECOV_DEMANGLE=0): cold dump, $dumps warm dumps, a profraw snapshot"
measure_large nodem LIVECOV_DEMANGLE=0
nodem_dir=$large_dir
default_ignore=$(sed -n 's/^livecov-default-ignore: //p' "$large_dir/stdout")
# The snapshot for LLVM, then the agent's LCOV at the same counts: the
# program is idle (only the agent's own code, which both leave out, runs).
: >"$large_dir/t_profraw"
for i in $(seq "$runs"); do
    dump "$large_sock" '/coverage?format=profraw' "$work/snap.profraw" >>"$large_dir/t_profraw"
done
dump "$large_sock" /coverage "$work/agent.lcov" >/dev/null
stop_large

echo "bench-agent: large serve (demangled, the default): cold dump, $dumps warm dumps"
measure_large dem
dem_dir=$large_dir
stop_large

own_src=$(printf '%s' "$root/agent-rust/src/" | sed 's/[][\\.*^$+?(){}|]/\\&/g')
ignore=("-ignore-filename-regex=$default_ignore" "-ignore-filename-regex=^$own_src")
run_llvm() { # run_llvm OUT [llvm-cov options...]
    "$profdata" merge -sparse "$work/snap.profraw" -o "$work/x.profdata" &&
        "$llvm_cov" export -format=lcov "$large" -instr-profile "$work/x.profdata" "${@:2}" >"$1"
}
echo "bench-agent: llvm-profdata merge -sparse + llvm-cov export over the snapshot, $runs timed runs"
run_llvm "$work/ref.lcov" "${ignore[@]}"   # warm-up, untimed
run_llvm "$work/full.lcov"
: >"$work/t_llvm"; : >"$work/t_llvm_full"
for _ in $(seq "$runs"); do
    s=$(now_ns); run_llvm "$work/ref.lcov" "${ignore[@]}"; e=$(now_ns)
    echo "$(((e - s) / 1000))" | awk '{ printf "%.3f\n", $1 / 1000 }' >>"$work/t_llvm"
    s=$(now_ns); run_llvm "$work/full.lcov"; e=$(now_ns)
    echo "$(((e - s) / 1000))" | awk '{ printf "%.3f\n", $1 / 1000 }' >>"$work/t_llvm_full"
done

t_llvm=$(median <"$work/t_llvm")
row() { # row LABEL MEDIAN P95|-: the speedup is LLVM's time (same report) over this one's
    awk -v label="$1" -v m="$2" -v p="$3" -v ref="$t_llvm" \
        'BEGIN { if (p == "-") printf "%-62s %10.1f %10s %10s\n", label, m, "-", "-";
                 else printf "%-62s %10.1f %10.1f %9.2fx\n", label, m, p, ref / m }'
}
echo
echo "1. warm dump, fixtures/large with the agent: $(grep -c '^FN:' "$work/full.lcov") FN records in the full report, $(grep -c '^SF:' "$work/ref.lcov") files reported;"
echo "   agent: $dumps dumps after the first (curl time_total); LLVM: median of $runs runs over a $(stat -c %s "$work/snap.profraw")-byte profraw"
printf "%-62s %10s %10s %10s\n" "what" "median ms" "p95 ms" "speedup"
row "agent GET /coverage, warm (LIVECOV_DEMANGLE=0)" "$(median <"$nodem_dir/t_warm")" "$(p95 <"$nodem_dir/t_warm")"
row "agent GET /coverage, warm (demangled, the default)" "$(median <"$dem_dir/t_warm")" "$(p95 <"$dem_dir/t_warm")"
row "llvm-profdata merge -sparse + llvm-cov export, same filters" "$t_llvm" -
row "llvm-profdata merge -sparse + llvm-cov export, full report" "$(median <"$work/t_llvm_full")" -
row "(agent GET /coverage?format=profraw, not in the LLVM time)" "$(median <"$nodem_dir/t_profraw")" -
awk -v a="$(median <"$nodem_dir/t_warm")" -v l="$t_llvm" \
    'BEGIN { s = l / a; printf "speedup of the warm dump over LLVM (same report): %.2fx (goal: at least 30x): %s\n", s, (s >= 30 ? "met" : "NOT met") }'
if cmp -s "$work/ref.lcov" "$work/agent.lcov"; then
    echo "agent LCOV (LIVECOV_DEMANGLE=0) = llvm-cov's over its profraw: yes ($(wc -c <"$work/agent.lcov") bytes)"
else
    differing=$( (diff "$work/ref.lcov" "$work/agent.lcov" || true) | grep -c '^[<>]' || true)
    echo "agent LCOV (LIVECOV_DEMANGLE=0) = llvm-cov's over its profraw: NO ($differing differing lines; diff $work/ref.lcov $work/agent.lcov)"
fi
case "${CARGO_HOME:-$HOME/.cargo}" in
    */.cargo) ;;
    *) echo "   (CARGO_HOME is not a .cargo folder: the agent also leaves out its own packages' registry sources, which the default ignore pattern does not)" ;;
esac

echo
echo "2. cold first dump and the agent's resident memory (of the whole process, MiB; 'after': $((dumps + 1)) dumps)"
printf "%-30s %14s %12s %12s %14s %12s\n" "large serve" "first dump ms" "VmRSS ready" "VmRSS after" "RssAnon after" "VmHWM after"
for d in "$nodem_dir:LIVECOV_DEMANGLE=0" "$dem_dir:demangled (default)"; do
    read -r r0 _ _ <"${d%%:*}/rss_ready"
    read -r r1 a1 h1 <"${d%%:*}/rss_after"
    awk -v label="${d#*:}" -v t="$(cat "${d%%:*}/t_cold")" -v r0="$r0" -v r1="$r1" -v a1="$a1" -v h1="$h1" \
        'BEGIN { printf "%-30s %14.1f %12.1f %12.1f %14.1f %12.1f\n", label, t, r0 / 1024, r1 / 1024, a1 / 1024, h1 / 1024 }'
done

# --- 3: the service's throughput under dumps ---------------------------------------
sdir="$work/service"
mkdir -p "$sdir"
"${clean_env[@]}" LIVECOV_DIR="$sdir/cov" LLVM_PROFILE_FILE="$sdir/exit-%p.profraw" \
    "$service" --addr 127.0.0.1:0 >"$sdir/stdout" 2>"$sdir/stderr" &
spid=$!
pids+=("$spid")
wait_for 300 grep -q '^listening on ' "$sdir/stdout" || { echo "bench-agent: the service did not start" >&2; exit 1; }
port=$(sed -n 's/^listening on .*://p' "$sdir/stdout")
ssock=$(ls "$sdir"/cov/sockets/rust-"$spid"-*.sock)
url="http://127.0.0.1:$port/fib?n=20"
[ "$(curl -sS --max-time 10 "$url")" = 6765 ] || { echo "bench-agent: /fib?n=20 is not 6765" >&2; exit 1; }
dump "$ssock" /coverage "$sdir/first.lcov" >"$sdir/t_first"   # the mapping is read once, before the runs

# cpu_ticks PID: user + system CPU time of the process so far, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# wrk_run SECS OUT [CPU_OUT]: prints requests/s; with CPU_OUT, appends the
# service's CPU time per request (µs, the agent's threads included): a
# figure that other work on the machine skews far less than requests/s.
wrk_run() {
    local before after
    before=$(cpu_ticks "$spid")
    wrk -t1 -c4 -d"$1s" --timeout 5s "$url" >"$2" 2>&1 || { echo "bench-agent: wrk failed:" >&2; cat "$2" >&2; exit 1; }
    after=$(cpu_ticks "$spid")
    if [ -n "${3:-}" ]; then
        awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" '/ requests in / { printf "%.2f\n", t / hz * 1e6 / $1 }' "$2" >>"$3"
    fi
    awk '/^Requests\/sec:/ { print $2 }' "$2"
}
# dump_loop SECS OUT: a dump every 100 ms, for at most SECS s, from one
# Python process on one Unix-socket connection per dump (a curl, date and awk
# per dump would cost the machine more than the dump itself); appends each
# dump's time (ms, request to last byte) to OUT.
dump_loop() {
    python3 - "$ssock" "$1" "$dump_period_ms" "$2" "$sdir/dump_failures" <<'EOF'
import socket, sys, time
path, secs, period_ms, out, failures = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
request = b"GET /coverage HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
times, failed = [], 0
start = time.monotonic()
next_at = start
while time.monotonic() - start < secs:
    t0 = time.monotonic()
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(120)
            s.connect(path)
            s.sendall(request)
            answer = b"".join(iter(lambda: s.recv(1 << 16), b""))
        if not answer.startswith(b"HTTP/1.1 200"):
            raise OSError(answer[:200])
        times.append((time.monotonic() - t0) * 1000)
    except OSError as e:
        failed += 1
        print(f"bench-agent: a dump failed: {e}", file=sys.stderr)
    next_at += period_ms / 1000
    time.sleep(max(0.0, next_at - time.monotonic()))
with open(out, "a") as f:
    f.writelines(f"{t:.3f}\n" for t in times)
if failed:
    with open(failures, "a") as f:
        f.write(f"{failed}\n")
EOF
}

echo
echo "bench-agent: service warm-up (2 s), then $rounds x (${load_secs} s without dumps, ${load_secs} s with a dump every ${dump_period_ms} ms)"
wrk_run 2 "$sdir/wrk-warmup" >/dev/null
: >"$sdir/rps_none"; : >"$sdir/rps_dumps"; : >"$sdir/t_dumps"; : >"$sdir/cpu_none"; : >"$sdir/cpu_dumps"; : >"$sdir/agent_share"
for r in $(seq "$rounds"); do
    wrk_run "$load_secs" "$sdir/wrk-none-$r" "$sdir/cpu_none" >>"$sdir/rps_none"
    dump_loop "$load_secs" "$sdir/t_dumps" &
    lpid=$!
    pids+=("$lpid")
    agent_before=$(run_ns "$spid" livecov); all_before=$(run_ns "$spid")
    wrk_run "$load_secs" "$sdir/wrk-dumps-$r" "$sdir/cpu_dumps" >>"$sdir/rps_dumps"
    agent_after=$(run_ns "$spid" livecov); all_after=$(run_ns "$spid")
    awk -v a=$((agent_after - agent_before)) -v t=$((all_after - all_before)) 'BEGIN { printf "%.2f\n", 100 * a / t }' >>"$sdir/agent_share"
    wait "$lpid"
    forget "$lpid"
done
curl -sS --max-time 10 "http://127.0.0.1:$port/quit" >/dev/null || true
stop "$spid"

echo "bench-agent: load average after the runs: $(load)"
rps_none=$(median <"$sdir/rps_none")
rps_dumps=$(median <"$sdir/rps_dumps")
echo
echo "3. fixtures/service GET /fib?n=20, wrk -t1 -c4 -d${load_secs}s on 127.0.0.1 (one connection at a time), median of $rounds"
cpu_none=$(median <"$sdir/cpu_none")
cpu_dumps=$(median <"$sdir/cpu_dumps")
printf "%-62s %12s %16s\n" "load" "requests/s" "CPU µs/request"
awk -v v="$rps_none" -v c="$cpu_none" 'BEGIN { printf "%-62s %12.1f %16.1f\n", "no dumps", v, c }'
awk -v v="$rps_dumps" -v c="$cpu_dumps" -v n="$(wc -l <"$sdir/t_dumps")" -v m="$(median <"$sdir/t_dumps")" -v p="$(p95 <"$sdir/t_dumps")" \
    'BEGIN { printf "%-62s %12.1f %16.1f\n", sprintf("/coverage every 100 ms (%d dumps, median %.1f ms, p95 %.1f ms)", n, m, p), v, c }'
echo "   per round, requests/s without: $(paste -sd' ' "$sdir/rps_none"); with dumps: $(paste -sd' ' "$sdir/rps_dumps")"
awk -v a="$rps_none" -v b="$rps_dumps" \
    'BEGIN { r = 100 * b / a; printf "throughput under dumps: %.1f%% of without (goal: at least 95%%): %s\n", r, (r >= 95 ? "met" : "NOT met") }'
awk -v a="$cpu_none" -v b="$cpu_dumps" \
    'BEGIN { printf "CPU per request under dumps: %.1f%% of without\n", 100 * b / a }'
awk -v s="$(median <"$sdir/agent_share")" -v all="$(paste -sd' ' "$sdir/agent_share")" \
    'BEGIN { printf "the agent'"'"'s threads ran %.2f%% of the service'"'"'s CPU time under load and dumps (per round: %s):\n   a CPU-bound service keeps %.1f%% of its throughput (goal: at least 95%%): %s\n", s, all, 100 - s, (100 - s >= 95 ? "met" : "NOT met") }'
if [ -s "$sdir/dump_failures" ]; then
    echo "   $(awk '{ n += $1 } END { print n }' "$sdir/dump_failures") dumps failed during the load (service stderr: $sdir/stderr)"
fi
for f in "$sdir"/wrk-none-* "$sdir"/wrk-dumps-*; do
    if grep -qE 'Socket errors|Non-2xx' "$f"; then
        echo "   $(basename "$f"): $(grep -E 'Socket errors|Non-2xx' "$f" | tr -s ' ' | tr '\n' ';')"
    fi
done
