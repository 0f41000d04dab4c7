#!/usr/bin/env bash
# Benchmarks live dumps of a busy real C server, side by side in one run:
# redis from Debian's source package (clang-19 coverage,
# tests/scripts/deps-redis.sh), liblivecov.so preloaded, its own timers at
# their default (serverCron ten times a second), redis-benchmark of the same
# build sending traffic the whole time.
#
# 1. Dumps: BENCH_BUSY_DUMPS (default 60) `GET /coverage` over the agent's
#    Unix socket, each BENCH_BUSY_GAP_MS (default 300) ms after the last
#    while traffic runs, so that every dump has the server's background
#    work and requests to catch up on (curl's time_total: the whole answer,
#    1.8 MB of LCOV, included, and discarded: writing it to a file would
#    add curl's own time); then, after the memory readings of 3 (100 dumps
#    and 25 s of traffic: the traffic's every command ran, and the records
#    of the files it reaches are kept in parts), as many again, the first
#    ones having been the first to reach those files (each computed whole
#    once); then as many with the traffic stopped
#    (SIGSTOP) 10 ms before each dump and started again after it: the
#    counters moved as much, but the dump has the CPUs to itself; then as
#    many with the timers only (no traffic). p50 and p95 of each. Beside
#    them, curl's floor: the same bytes (the held dump's, below) fetched as often from a trivial server
#    (bench-common.sh's serve_file) while the same traffic runs against a
#    server without the agent. Of both under traffic, the time to the
#    first byte too (curl's time_starttransfer): what the transfer takes
#    is the rest. Of each dump, the agent's own time to make the report
#    (its Server-Timing header): the rest of the dump is the connection,
#    the request and the transfer.
# 2. The peer on the same snapshot: the server held still (`DEBUG SLEEP`),
#    its `?format=profraw` before and after (they must be the same bytes),
#    and between them one dump; then dumps of the held server, where
#    nothing changed (what answering costs without computing); then
#    `llvm-profdata merge -sparse` and
#    `llvm-cov export -format=lcov` of LLVM 22 with the binary, median of
#    BENCH_RUNS (default 5) runs; the ratio to the dumps' p50; and whether
#    the dump is llvm-cov's report byte for byte. The held server takes no
#    traffic: the peer runs on idle CPUs, where the dumps ran beside the
#    server and its clients. So the peer also runs as often under the same
#    traffic (against a server without the agent, in 3), for the ratio in
#    the same conditions.
# 3. Memory: VmRSS of the server with the agent, and its anonymous part
#    (RssAnon) apart (no dump, once the agent rested after its start;
#    after 1, 10 and 100 dumps under traffic; 1.5 s after the last, once
#    it rests again: see docs/agent.md), each beside that of a server without it
#    after as long a time of the same traffic (redis's own memory grows
#    with it: 2.9 MiB from 4 s to 45 s), against the size of the binary's
#    __llvm_covfun section.
# 4. Throughput: redis-benchmark's requests per second (SET and GET,
#    BENCH_BUSY_LOAD_REQUESTS each, default 200000) without the agent, with
#    it and no dumps, and with a dump every 100 ms; and, for the client's
#    own cost (curl started ten times a second, 1.8 MB read each time),
#    without the agent while the same bytes are fetched as often from a
#    trivial server; median of BENCH_BUSY_ROUNDS (default 3) rounds of the
#    four, interleaved.
# 5. Forked children: BENCH_BUSY_FORKS (default 8) `BGSAVE`s of 100,000 keys,
#    each child's time from its fork to its exit (read in /proc every
#    0.2 ms): without the agent; with it, the server never dumped (its agent
#    makes its records at the first fork after a child reported, the
#    second: docs/agent.md); with it, a dump before each; and the server's
#    anonymous memory once its agent rests.
# BENCH_BUSY_REV=COMMIT measures that commit's liblivecov instead of the
# checkout's (as bench-fleet.sh). Prints progress on stderr, the table on
# stdout. Every loop is bounded; loopback only; not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-5}
dumps=${BENCH_BUSY_DUMPS:-60}
gap_ms=${BENCH_BUSY_GAP_MS:-300}
load_requests=${BENCH_BUSY_LOAD_REQUESTS:-200000}
forks=${BENCH_BUSY_FORKS:-8}
rounds=${BENCH_BUSY_ROUNDS:-3}
source "$root/tests/scripts/bench-common.sh"
log() { echo "bench-busy: $*" >&2; }
die() { log "$*"; exit 1; }
install_tools curl=curl ss=iproute2 python3=python3

# --- builds --------------------------------------------------------------------
sources_of "${BENCH_BUSY_REV:-}" bench-busy
label="liblivecov $rev_label"
log "building $label (release-native)"
(cd "$src" && "${clean_env[@]}" CARGO_TARGET_DIR="$build_dir" cargo build --quiet -p livecov-native --profile release-native) ||
    die "the build of liblivecov failed"
preload="$build_dir/release-native/liblivecov.so"

log "redis from Debian's source package, clang-19 coverage (tests/scripts/deps-redis.sh; built once)"
"$root/tests/scripts/deps-redis.sh" >&2 || die "tests/scripts/deps-redis.sh failed"
redis_build=$(readlink "$root/target/redis/current")
work="$root/target/bench-busy"
rm -rf "$work"
mkdir -p "$work/bin"
# Copies: the agent reads the coverage mapping from the running file.
for b in redis-server redis-benchmark redis-cli; do cp "$root/target/redis/current/src/src/$b" "$work/bin/$b"; done
server="$work/bin/redis-server"
# Socket paths are limited to 107 bytes: a short folder of their own.
cov=$(mktemp -d "${TMPDIR:-/tmp}/livecov-busy.XXXXXX")
clients_profile="$work/clients-%1m.profraw"

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$cov"
}
trap cleanup EXIT

port=$(free_port)
# start_server WITH_AGENT: one redis-server, its pid in $server_pid.
start_server() {
    local env=(env LLVM_PROFILE_FILE="$work/server-%p.profraw")
    [ "$1" = yes ] && env+=(LD_PRELOAD="$preload" LIVECOV_DIR="$cov/dir")
    rm -rf "$cov/dir"
    "${env[@]}" "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --dir "$work" \
        --enable-debug-command local --logfile "" >"$work/server.log" 2>&1 </dev/null &
    server_pid=$!
    pids+=("$server_pid")
    wait_for 100 env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-cli" -p "$port" ping >/dev/null 2>&1 ||
        die "redis-server did not start (server.log)"
    if [ "$1" = yes ]; then
        wait_for 100 bash -c "ls '$cov/dir/sockets/'*.sock >/dev/null 2>&1" || die "no agent socket"
        socket=$(ls "$cov/dir/sockets/"*.sock)
    fi
}
stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}
# rss_kib [FIELD]: the server's VmRSS (or RssAnon, ...) in KiB.
rss_kib() { awk -v f="${1:-VmRSS}:" '$1 == f { print $2 }' "/proc/$server_pid/status"; }
# code_kib: the resident KiB of liblivecov.so's code in the server: the
# part of what the agent adds that warm-code.ld keeps small.
code_kib() {
    awk '/^[0-9a-f]+-[0-9a-f]+ / { code = ($2 == "r-xp" && $6 ~ /liblivecov[^\/]*\.so$/) } code && $1 == "Rss:" { kib += $2 } END { print kib + 0 }' \
        "/proc/$server_pid/smaps"
}
# The CPU time (ns) of the agent's threads (named livecov-*) so far: on two
# shared cores a dump under traffic waits for a CPU as long as it runs.
agent_cpu_ns() { run_ns "$server_pid" livecov; }
# dump OUT [SOCKET]: one GET /coverage (of the agent), its time in ms on
# stdout; with first_byte set, the time to its first byte appended there,
# and with report set, the agent's own time to make the report.
dump() { fetch_ms "${2:-$socket}" "$1" "${first_byte:-}" "${report:-}"; }
# timed_dumps OUT [stopped]: $dumps dumps, $gap_ms apart, their times into
# OUT (the agent's own, to make each report, into OUT.report), the agent's
# mean CPU time per dump (ns) in $cpu_per_dump; "stopped":
# the traffic stopped 10 ms before each dump and started again after it.
timed_dumps() {
    local before
    before=$(agent_cpu_ns)
    : >"$1"
    : >"$1.report"
    for _ in $(seq "$dumps"); do
        sleep_ms "$gap_ms"
        if [ "${2:-}" = stopped ]; then
            pkill -STOP -P "$traffic_pid" || true
            sleep_ms 10
        fi
        report="$1.report" dump /dev/null >>"$1"
        if [ "${2:-}" = stopped ]; then pkill -CONT -P "$traffic_pid" || true; fi
    done
    cpu_per_dump=$((($(agent_cpu_ns) - before) / dumps))
}
# traffic SECONDS: redis-benchmark in a loop (-l), bounded by time.
traffic() {
    timeout "$1" env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-benchmark" -p "$port" -q -l -c 4 \
        -t set,get,incr,lpush,lpop,hset,lrange_100 -r 10000 >/dev/null 2>&1 &
    traffic_pid=$!
    pids+=("$traffic_pid")
}

# --- 1 and 3: dumps under traffic, and memory -----------------------------------
# The server's own memory grows under traffic (its keys and lists): each
# reading with the agent is paired with one of a server without it, taken
# after as long a time of the same traffic.
traffic_start=0
# at_rss NAME: VmRSS, RssAnon and the agent's code now, and the seconds of
# traffic so far, as NAME, NAME_anon, NAME_code and NAME_at.
at_rss() {
    printf -v "$1" '%s' "$(rss_kib)"
    printf -v "$1_anon" '%s' "$(rss_kib RssAnon)"
    printf -v "$1_code" '%s' "$(code_kib)"
    printf -v "$1_at" '%s' "$((($(now_ns) - traffic_start) / 1000000))"
}
start_server yes
traffic_start=$(now_ns)
traffic 600
# The agent rests a second after its start (docs/agent.md).
sleep 1.5
at_rss rss_agent
t_cold=$(dump /dev/null)
at_rss rss_1
log "$dumps dumps under traffic, ${gap_ms} ms apart"
cpu_before=$(agent_cpu_ns)
: >"$work/t_busy"
: >"$work/f_busy"
: >"$work/r_busy"
n=1
for _ in $(seq "$dumps"); do
    sleep_ms "$gap_ms"
    first_byte="$work/f_busy" report="$work/r_busy" dump /dev/null >>"$work/t_busy"
    n=$((n + 1))
    [ "$n" -eq 10 ] && at_rss rss_10
done
cpu_busy=$((($(agent_cpu_ns) - cpu_before) / dumps))
while [ "$n" -lt 100 ]; do
    sleep_ms 50
    dump /dev/null >/dev/null
    n=$((n + 1))
    [ "$n" -eq 10 ] && at_rss rss_10
done
at_rss rss_100
sleep 1.5
at_rss rss_rest
log "$dumps dumps under traffic again, once its files were all reached"
timed_dumps "$work/t_later"
# Whether a dump under traffic waits for the CPUs or works: the same
# dumps with the load generator stopped for each (the counters still
# moved since the last, and what the dump reads is as cold).
log "$dumps dumps under traffic, the traffic stopped for each"
timed_dumps "$work/t_paused" stopped
cpu_paused=$cpu_per_dump
kill "$traffic_pid" 2>/dev/null || true
sleep 0.5
log "$dumps dumps with the timers only"
timed_dumps "$work/t_timers"
cpu_timers=$cpu_per_dump

# --- 2: the same snapshot for the peer -------------------------------------------
log "the peer: llvm-profdata merge + llvm-cov export over a snapshot of the held server"
traffic 10
sleep 2
timeout 20 env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-cli" -p "$port" DEBUG SLEEP 8 >/dev/null 2>&1 &
pids+=($!)
sleep 1
curl -s --max-time 30 --unix-socket "$socket" -o "$work/before.profraw" 'localhost/coverage?format=profraw'
t_held=$(dump "$work/held.lcov")
curl -s --max-time 30 --unix-socket "$socket" -o "$work/after.profraw" 'localhost/coverage?format=profraw'
: >"$work/t_unchanged"
for _ in $(seq 10); do dump /dev/null >>"$work/t_unchanged"; done
same_moment=no
cmp -s "$work/before.profraw" "$work/after.profraw" && same_moment=yes
run_llvm() {
    "$profdata" merge -sparse "$work/after.profraw" -o "$work/x.profdata" &&
        "$llvm_cov" export -format=lcov "$server" -instr-profile "$work/x.profdata" >"$work/llvm.lcov"
}
# time_llvm OUT: the peer's time, in ms, of $runs runs, into OUT.
time_llvm() {
    : >"$1"
    for _ in $(seq "$runs"); do
        s=$(now_ns); run_llvm; e=$(now_ns)
        echo "$(((e - s) / 1000))" | awk '{ printf "%.3f\n", $1 / 1000 }' >>"$1"
    done
}
run_llvm
time_llvm "$work/t_llvm"
identical=no
cmp -s "$work/llvm.lcov" "$work/held.lcov" && identical=yes
kill "$traffic_pid" 2>/dev/null || true
stop_server

log "the same traffic without the agent, for its memory at the same times, curl's floor, and the peer under traffic"
start_server no
traffic_start=$(now_ns)
traffic 600
serve_file "$cov/floor.sock" "$work/held.lcov"
pids+=("$floor_pid")
: >"$work/f_floor"
( sleep 1.5; floor_times "$cov/floor.sock" "$dumps" "$gap_ms" "$work/f_floor" >"$work/t_floor" ) &
floor_loop=$!
pids+=("$floor_loop")
for point in agent 1 10 100 rest; do
    at_ms_var="rss_${point}_at"
    while [ $((($(now_ns) - traffic_start) / 1000000)) -lt "${!at_ms_var}" ]; do sleep 0.05; done
    printf -v "none_$point" '%s' "$(rss_kib)"
    printf -v "none_${point}_anon" '%s' "$(rss_kib RssAnon)"
done
wait "$floor_loop" || true
time_llvm "$work/t_llvm_busy"
kill "$floor_pid" "$traffic_pid" 2>/dev/null || true
stop_server

# --- 4: throughput -----------------------------------------------------------------
throughput() { # requests/s of SET and GET together
    env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-benchmark" -p "$port" -q -c 8 -n "$load_requests" -t set,get -r 10000 2>/dev/null |
        tr '\r' '\n' | awk '/requests per second/ { sub(/:/, "", $2); n++; s += $2 } END { if (n) printf "%.0f\n", s / n; else print "nan" }'
}
: >"$work/rps_none"; : >"$work/rps_agent"; : >"$work/rps_dumps"; : >"$work/rps_floor"; : >"$work/t_cold_idle"
for r in $(seq "$rounds"); do
    log "throughput round $r of $rounds"
    start_server no
    throughput >>"$work/rps_none"
    stop_server
    start_server yes
    # Each round's first dump is a cold one too, of the idle server once
    # its agent rests: more samples of it than the one under traffic.
    sleep 1.5
    dump /dev/null >>"$work/t_cold_idle"
    throughput >>"$work/rps_agent"
    ( for _ in $(seq 3000); do sleep 0.1; dump /dev/null >/dev/null || true; done ) &
    dumper=$!
    pids+=("$dumper")
    throughput >>"$work/rps_dumps"
    kill "$dumper" 2>/dev/null || true
    wait "$dumper" 2>/dev/null || true
    stop_server
    start_server no
    serve_file "$cov/floor-$r.sock" "$work/held.lcov"
    pids+=("$floor_pid")
    ( for _ in $(seq 3000); do sleep 0.1; dump /dev/null "$cov/floor-$r.sock" >/dev/null || true; done ) &
    fetcher=$!
    pids+=("$fetcher")
    throughput >>"$work/rps_floor"
    kill "$fetcher" "$floor_pid" 2>/dev/null || true
    wait "$fetcher" 2>/dev/null || true
    stop_server
done

# --- 5: forked children -------------------------------------------------------------
# bgsaves OUT [dumped]: $forks BGSAVEs of the running server, each child's
# lifetime in ms into OUT; "dumped": a dump before each. The watcher asks
# for the BGSAVE itself once it watches.
bgsaves() {
    : >"$1"
    for _ in $(seq "$forks"); do
        [ "${2:-}" = dumped ] && dump /dev/null >/dev/null
        python3 - "$server_pid" "$port" "$1" <<'PY' || true
import socket, sys, time
parent, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
listed = f"/proc/{parent}/task/{parent}/children"
def state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
with socket.create_connection(("127.0.0.1", port)) as redis:
    redis.sendall(b"BGSAVE\r\n")
    if not redis.recv(256).startswith(b"+"):
        sys.exit("BGSAVE refused")
deadline, child, born = time.monotonic() + 30, None, None
while time.monotonic() < deadline:
    if child is None:
        kids = open(listed).read().split()
        if kids and state(kids[0]) not in ("Z", "X", "gone"):
            child, born = kids[0], time.monotonic()
    elif state(child) in ("Z", "X", "gone"):
        with open(out, "a") as f:
            f.write("%.3f\n" % ((time.monotonic() - born) * 1000))
        break
    time.sleep(0.0002)
PY
        # Reaped by the server's timers, ten times a second.
        sleep 0.3
    done
}
for variant in none never dumped; do
    log "$forks BGSAVEs: the agent $variant"
    # Each server starts empty: redis loads the dump.rdb of the variant
    # before, and 100,000 keys loaded take more of its memory than set.
    rm -f "$work/dump.rdb"
    if [ "$variant" = none ]; then start_server no; else start_server yes; fi
    env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-benchmark" -p "$port" -q -t set -n 100000 -r 100000 >/dev/null 2>&1
    bgsaves "$work/t_fork_$variant" "$variant"
    sleep 1.5
    printf -v "fork_anon_$variant" '%s' "$(rss_kib RssAnon)"
    stop_server
done

# --- the table ------------------------------------------------------------------------
covfun_hex=$(objdump -h "$server" | awk '$2 == "__llvm_covfun" { print $3 }')
covfun=$((16#${covfun_hex:-0}))
p50_busy=$(median <"$work/t_busy")
t_llvm=$(median <"$work/t_llvm")
t_llvm_busy=$(median <"$work/t_llvm_busy")
ver=${redis_build%-*}
echo
echo "busy: redis $ver (Debian's source package; clang-19 coverage), LD_PRELOAD $label, its timers at hz 10,"
echo "redis-benchmark (7 commands, 4 clients) running; dumps ${gap_ms} ms apart, curl time_total over the Unix socket;"
echo "peer: llvm-profdata merge -sparse + llvm-cov export (LLVM 22) over the same snapshot, median of $runs; load after: $(load) on $(nproc) CPUs"
printf "%-62s %10s %10s\n" "what" "p50" "p95"
printf "%-62s %10.2f %10.2f\n" "dump under traffic, ms ($dumps)" "$p50_busy" "$(p95 <"$work/t_busy")"
printf "%-62s %10.2f %10.2f\n" "  to its first byte (the rest is the transfer), ms" "$(median <"$work/f_busy")" "$(p95 <"$work/f_busy")"
printf "%-62s %10.2f %10.2f\n" "  the agent making the report (its Server-Timing), ms" "$(median <"$work/r_busy")" "$(p95 <"$work/r_busy")"
printf "%-62s %10.2f %10.2f\n" "the same after 100 dumps and 25 s of traffic, ms ($dumps)" "$(median <"$work/t_later")" "$(p95 <"$work/t_later")"
printf "%-62s %10.2f %10.2f\n" "  the agent making the report, ms" "$(median <"$work/t_later.report")" "$(p95 <"$work/t_later.report")"
printf "%-62s %10.2f %10.2f\n" "its bytes from a trivial server, same traffic (floor), ms" "$(median <"$work/t_floor")" "$(p95 <"$work/t_floor")"
printf "%-62s %10.2f %10.2f\n" "  to their first byte, ms" "$(median <"$work/f_floor")" "$(p95 <"$work/f_floor")"
printf "%-62s %10.2f %10.2f\n" "dump under traffic stopped for it, ms ($dumps)" "$(median <"$work/t_paused")" "$(p95 <"$work/t_paused")"
printf "%-62s %10.2f %10.2f\n" "  the agent making the report, ms" "$(median <"$work/t_paused.report")" "$(p95 <"$work/t_paused.report")"
printf "%-62s %10.2f %10.2f\n" "dump with the timers only, ms ($dumps)" "$(median <"$work/t_timers")" "$(p95 <"$work/t_timers")"
printf "%-62s %10.2f %10.2f\n" "  the agent making the report, ms" "$(median <"$work/t_timers.report")" "$(p95 <"$work/t_timers.report")"
awk -v n="$cpu_busy" 'BEGIN { printf "%-62s %10.2f %10s\n", "agent CPU per dump under traffic (mean, schedstat), ms", n / 1e6, "-" }'
awk -v n="$cpu_paused" 'BEGIN { printf "%-62s %10.2f %10s\n", "agent CPU per dump under traffic stopped for it (mean), ms", n / 1e6, "-" }'
awk -v n="$cpu_timers" 'BEGIN { printf "%-62s %10.2f %10s\n", "agent CPU per dump with the timers only (mean), ms", n / 1e6, "-" }'
printf "%-62s %10.2f %10.2f\n" "dump of the held server (nothing changed), ms (10)" "$(median <"$work/t_unchanged")" "$(p95 <"$work/t_unchanged")"
printf "%-62s %10.2f %10s\n" "first dump (cold), ms" "$t_cold" "-"
printf "%-62s %10.2f %10s\n" "first dump (cold) of the idle server, ms (median of $rounds starts)" "$(median <"$work/t_cold_idle")" "-"
printf "%-62s %10.2f %10s\n" "llvm-profdata + llvm-cov on the same snapshot, ms" "$t_llvm" "-"
awk -v l="$t_llvm" -v d="$p50_busy" 'BEGIN { printf "%-62s %9.1fx %10s\n", "ratio: peer / dump under traffic (p50; goal: at least 100x)", l / d, "-" }'
awk -v l="$t_llvm" -v d="$(median <"$work/t_later")" 'BEGIN { printf "%-62s %9.1fx %10s\n", "ratio: peer / dump under traffic after 100 dumps (p50)", l / d, "-" }'
awk -v l="$t_llvm" -v d="$(median <"$work/t_timers")" 'BEGIN { printf "%-62s %9.1fx %10s\n", "ratio: peer / dump with the timers only (p50)", l / d, "-" }'
printf "%-62s %10.2f %10s\n" "the peer under the same traffic, ms" "$t_llvm_busy" "-"
awk -v l="$t_llvm_busy" -v d="$p50_busy" 'BEGIN { printf "%-62s %9.1fx %10s\n", "ratio: peer / dump, both under traffic (p50)", l / d, "-" }'
echo "same moment: $same_moment; the held dump is llvm-cov's report byte for byte: $identical"
echo
# Anonymous memory apart: the rest of what is added is mostly the agent's
# code (the last column), clean pages of its file that the kernel reclaims
# first.
printf "%-52s %8s %8s %8s %8s %8s\n" "resident memory (VmRSS), MiB, at seconds of traffic" "without" "with" "added" "anon" "code"
memory_row() { # LABEL POINT
    local with="rss_$2" without="none_$2" at="rss_$2_at" with_anon="rss_$2_anon" without_anon="none_$2_anon" code="rss_$2_code"
    awk -v l="$1" -v s="${!at}" -v w="${!with}" -v n="${!without}" -v wa="${!with_anon}" -v na="${!without_anon}" -v c="${!code}" \
        'BEGIN { printf "%-52s %8.1f %8.1f %8.1f %8.1f %8.1f\n", sprintf("%s (%.0f s)", l, s / 1000), n / 1024, w / 1024, (w - n) / 1024, (wa - na) / 1024, c / 1024 }'
}
memory_row "before the first dump" agent
memory_row "after 1 dump" 1
memory_row "after 10 dumps" 10
memory_row "after 100 dumps" 100
memory_row "1.5 s after, the agent at rest" rest
awk -v a="$rss_100" -v n="$none_100" -v c="$covfun" \
    'BEGIN { printf "%-52s %26.1f\n", sprintf("added after 100 dumps, MiB (goal: at most 4 x __llvm_covfun, %.1f MiB)", 4 * c / 1048576), (a - n) / 1024 }'
# The dumps after the first keep what the functions that run need (see
# docs/agent.md): what is added grows over the first tens of dumps, then
# no longer with their number.
awk -v a10="$rss_10" -v n10="$none_10" -v a="$rss_100" -v n="$none_100" \
    'BEGIN { printf "%-52s %26.1f\n", "growth of what it added, from dump 10 to dump 100, MiB", ((a - n) - (a10 - n10)) / 1024 }'
echo
printf "%-62s %10s\n" "throughput, SET + GET, median of $rounds" "req/s"
printf "%-62s %10s\n" "without the agent" "$(median <"$work/rps_none")"
printf "%-62s %10s\n" "with the agent, no dumps" "$(median <"$work/rps_agent")"
printf "%-62s %10s\n" "with the agent, a dump every 100 ms" "$(median <"$work/rps_dumps")"
printf "%-62s %10s\n" "without it, its bytes fetched every 100 ms from a trivial server" "$(median <"$work/rps_floor")"
echo
printf "%-62s %10s %10s\n" "BGSAVE of 100,000 keys, the child's fork to exit, ms ($forks)" "p50" "p95"
printf "%-62s %10.2f %10.2f\n" "without the agent" "$(median <"$work/t_fork_none")" "$(p95 <"$work/t_fork_none")"
printf "%-62s %10.2f %10.2f\n" "with the agent, the server never dumped" "$(median <"$work/t_fork_never")" "$(p95 <"$work/t_fork_never")"
printf "%-62s %10.2f %10.2f\n" "with the agent, a dump before each" "$(median <"$work/t_fork_dumped")" "$(p95 <"$work/t_fork_dumped")"
awk -v n="$fork_anon_none" -v a="$fork_anon_never" -v d="$fork_anon_dumped" \
    'BEGIN { printf "%-62s %10.1f %10.1f\n", "anonymous memory added once it rests, MiB: never dumped, dumped", (a - n) / 1024, (d - n) / 1024 }'
