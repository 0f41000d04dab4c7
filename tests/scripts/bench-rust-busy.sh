#!/usr/bin/env bash
# Benchmarks live dumps of busy Rust programs with the Rust agent (crate
# livecov, a dependency of theirs, livecov::start() in main), side by side in
# one run, as bench-busy.sh does for redis under LD_PRELOAD. Both are built
# as users build them (`cargo build`, -C instrument-coverage) and keep
# working between dumps, as real services do:
#
# - fixtures/service with SERVICE_TICK_MS (default BENCH_RUST_BUSY_TICK_MS=100):
#   a thread recomputes a status with the handlers every tick; wrk sends
#   requests (/fib, /hello, /primes in turn) during the first dumps;
# - fixtures/large `serve --tick-ms` (BENCH_RUST_BUSY_LARGE_TICK_MS, default
#   200): bench.sh's workload, then its commands again, one a tick;
# - mini-redis 0.4.1 from crates.io (tokio's example server; nobody here
#   wrote it), built with the Cargo.lock it is published with, the agent
#   added as the tests add it: redis-benchmark sends SET with a 5 ms expiry
#   and GET, and the server's own task purges the expired keys.
#
# For each, one table:
# 1. Dumps: BENCH_RUST_BUSY_DUMPS (default 60) `GET /coverage` over the
#    agent's Unix socket, each BENCH_RUST_BUSY_GAP_MS (default 300) ms after
#    the last (curl's time_total), p50 and p95: the service under traffic,
#    then both with their background work only; of each, the agent's own
#    time to make the report (its Server-Timing header); the agent's CPU
#    time per dump (the schedstat of its threads, named livecov*); the
#    first (cold) dump. For mini-redis, curl's floor beside them: its report's bytes
#    fetched as often from a trivial server (bench-common.sh's serve_file)
#    while the same traffic runs against the server without the agent.
# 2. The peer on the same snapshot: the program held still (the service's
#    /hold, `hold` on large's stdin), `?format=profraw` before and after one
#    dump, then `llvm-profdata merge -sparse` and `llvm-cov export
#    -format=lcov` of LLVM 22 with the binary, median of BENCH_RUNS (default
#    5), and the ratio to the dumps' p50. The agent's own code runs during
#    the dumps and is instrumented too, so the two profraws differ in its
#    counters: "same moment" says llvm-cov reports the same from both.
#    llvm-cov gets -ignore-filename-regex for what the agent leaves out (its
#    default LIVECOV_IGNORE: the standard library, registry and git
#    dependencies; and its own sources and packages), and the agent
#    LIVECOV_DEMANGLE=0, so that the held dump can be llvm-cov's report byte
#    for byte.
# 3. Memory: VmRSS (and its anonymous part, RssAnon) with the background
#    work (and the traffic) running: with the agent before the first dump,
#    after 1, 10 and 100 dumps, each beside that of the program without the
#    agent (LIVECOV_DIR unset, run afterwards) at as long a time after its
#    start, as the programs' own memory grows as they work (fixtures/large:
#    0.9 MiB in its first 20 s); the memory the agent adds, against the size
#    of the binary's __llvm_covfun section, and how much it grew from the
#    first dump to the 100th.
# 4. The service's requests/s under wrk (BENCH_RUST_BUSY_LOAD_SECS, default
#    5, one connection at a time) without dumps and with a dump every 100 ms,
#    the ticker running; BENCH_RUST_BUSY_ROUNDS (default 3) pairs, medians;
#    and the service's CPU time per request (its /proc stat, the ticker and
#    the agent included), which other work on the machine skews far less.
# BENCH_RUST_BUSY_REV=COMMIT builds the programs with that commit's agent
# (the checkout's fixtures, their livecov dependency pointed at the commit's
# agent-rust) instead of the checkout's. Progress on stderr, the tables on
# stdout. Every loop is bounded; loopback only; not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-5}
dumps=${BENCH_RUST_BUSY_DUMPS:-60}
gap_ms=${BENCH_RUST_BUSY_GAP_MS:-300}
tick_ms=${BENCH_RUST_BUSY_TICK_MS:-100}
large_tick_ms=${BENCH_RUST_BUSY_LARGE_TICK_MS:-200}
load_secs=${BENCH_RUST_BUSY_LOAD_SECS:-5}
rounds=${BENCH_RUST_BUSY_ROUNDS:-3}
source "$root/tests/scripts/bench-common.sh"
log() { echo "bench-rust-busy: $*" >&2; }
die() { log "$*"; exit 1; }
install_tools curl=curl wrk=wrk objdump=binutils flock=util-linux redis-benchmark=redis-tools ss=iproute2 python3=python3
log "load average before the runs: $(load) on $(nproc) CPUs"

# --- builds --------------------------------------------------------------------
sources_of "${BENCH_RUST_BUSY_REV:-}" bench-rust-busy
label="agent $rev_label"
work="$root/target/bench-rust-busy"
rm -rf "$work"
mkdir -p "$work"

# fixture NAME: sets fixture_src (the fixture's sources to build) and
# fixture_target. The checkout's agent: the fixture in place, built where
# bench-agent.sh and the tests build it; another commit's: a copy of the
# checkout's fixture whose livecov dependency is that commit's agent-rust.
fixture() {
    local name=$1
    if [ "$src" = "$root" ]; then
        fixture_src="$root/fixtures/$name"
        case "$name" in
            service) fixture_target="$root/target/fixtures/service" ;;
            large) fixture_target="$root/target/fixtures/large-agent" ;;
        esac
        locked=(--locked)
    else
        fixture_src="$build_dir/fixtures/$name"
        fixture_target="$build_dir/fixtures-target/$name"
        rm -rf "$fixture_src"
        mkdir -p "$build_dir/fixtures"
        cp -r "$root/fixtures/$name" "$fixture_src"
        sed -i "s|path = \"../../agent-rust\"|path = \"$src/agent-rust\"|" "$fixture_src/Cargo.toml"
        grep -q "path = \"$src/agent-rust\"" "$fixture_src/Cargo.toml" || die "fixtures/$name: no livecov path dependency to point at $rev_label"
        locked=()   # that agent's dependencies may need other versions in the copy's lock
    fi
    mkdir -p "$fixture_target"
}

# With --target, RUSTFLAGS reach the program and its libraries (the agent
# too, as in any coverage build) but not build scripts and proc macros.
log "building fixtures/large --features agent and fixtures/service with -C instrument-coverage ($label)"
fixture large
# Its dependencies optimized (see bench-common.sh): its own profile leaves
# them as they are for `livecov convert`'s benchmark of its mapping.
(cd "$fixture_src" && "${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$fixture_target" \
    cargo build --quiet "${locked[@]}" --target "$host" --features agent "${optimized_dependencies[@]}" </dev/null) ||
    die "the build of fixtures/large failed"
# A copy: the agent reads the coverage mapping from the running file.
cp "$fixture_target/$host/debug/large" "$work/large"
fixture service
# The tests lock the service's target folder while they build there.
(cd "$fixture_src" && flock "$fixture_target/.lock" "${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" \
    CARGO_TARGET_DIR="$fixture_target" cargo build --quiet "${locked[@]}" --target "$host" </dev/null) ||
    die "the build of fixtures/service failed"
flock "$fixture_target/.lock" cp "$fixture_target/$host/debug/service" "$work/service"

# mini-redis: its sources as cargo fetches them, `livecov::start()` before
# the first line of its main, built as the fixtures are (dependencies
# optimized, as docs/agent.md advises for coverage builds).
mini_redis=mini-redis-0.4.1
log "building $mini_redis from crates.io with the agent and -C instrument-coverage ($label)"
mkdir -p "$work/fetch/src"
printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[workspace]\n\n[dependencies]\nmini-redis = "=0.4.1"\n' \
    >"$work/fetch/Cargo.toml"
: >"$work/fetch/src/lib.rs"
(cd "$work/fetch" && "${clean_env[@]}" cargo fetch --quiet </dev/null) || die "cargo could not fetch $mini_redis"
fetched=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$mini_redis" | head -1)
[ -f "$fetched/Cargo.lock" ] || die "no $mini_redis with its Cargo.lock in cargo's registry cache"
rm -rf "$work/$mini_redis"
cp -r "$fetched" "$work/$mini_redis"
printf '\n[workspace]\n\n[dependencies.livecov]\npath = "%s"\n' "$src/agent-rust" >>"$work/$mini_redis/Cargo.toml"
sed -i 's|^    tracing_subscriber::fmt::try_init()?;$|    livecov::start();\n&|' "$work/$mini_redis/src/bin/server.rs"
grep -q 'livecov::start();' "$work/$mini_redis/src/bin/server.rs" || die "$mini_redis: its main changed"
(cd "$work/$mini_redis" && "${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$root/target/bench-mini-redis" \
    cargo build --quiet --bin mini-redis-server --target "$host" "${optimized_dependencies[@]}" </dev/null) ||
    die "the build of $mini_redis failed"
cp "$root/target/bench-mini-redis/$host/debug/mini-redis-server" "$work/mini-redis-server"

# What the agent leaves out, for llvm-cov: its default ignore pattern (as the
# built agent prints it, below) and its own sources and packages (as
# agent-rust/src/agent/config.rs matches them).
config_rs="$src/agent-rust/src/agent/config.rs"
agent_packages=$(sed -n '/AGENT_PACKAGES: &\[&str\] = &\[/,/\];/p' "$config_rs" | grep -o '"[^"]*"' | tr -d '"' | paste -sd'|')
[ -n "$agent_packages" ] || die "no AGENT_PACKAGES in $config_rs"
own_src=$(printf '%s' "$src/agent-rust/src/" | sed 's/[][\\.*^$+?(){}|]/\\&/g')
agent_ignore=("-ignore-filename-regex=^$own_src" "-ignore-filename-regex=/(registry/src/[^/]+|git/checkouts/[^/]+/[^/]+)/($agent_packages)-[0-9][^/]*/")

# --- helpers ---------------------------------------------------------------------
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
forget() { # forget PID: a process that ended is no longer the cleanup's
    local p kept=()
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}
# alive PID: it runs (an ended child that is not waited for yet does not).
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" != Z ]; }
# stop PID: up to 5 s for it to end, then SIGTERM (the agent writes its
# final report), then SIGKILL after 5 s more.
stop() {
    if ! wait_for 50 eval "! alive $1"; then
        kill -TERM "$1" 2>/dev/null || true
        wait_for 50 eval "! alive $1" || kill -KILL "$1" 2>/dev/null || true
    fi
    wait "$1" 2>/dev/null || true
    forget "$1"
}
# rss_kib PID: VmRSS and RssAnon, KiB (VmRSS counts the pages of the
# executable's file that the agent reads, the coverage mapping's among them).
rss_kib() { awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } END { print r "/" a }' "/proc/$1/status"; }
# agent_cpu_ns PID: the CPU time (ns) of its agent's threads (named livecov*)
# so far: on two shared cores a dump under load waits for a CPU as long as
# it runs.
agent_cpu_ns() { run_ns "$1" livecov; }
# dump SOCKET OUT [QUERY]: one GET /coverage, its time in ms on stdout.
dump() {
    local t
    t=$(curl -sS --fail --max-time 60 --unix-socket "$1" -o "$2" -w '%{time_total}' "localhost/coverage${3:-}") ||
        die "GET /coverage${3:-} failed"
    awk -v t="$t" 'BEGIN { printf "%.3f\n", t * 1000 }'
}
ms_since() { echo $((($(now_ns) - $1) / 1000)) | awk '{ printf "%.3f\n", $1 / 1000 }'; }
covfun_bytes() {
    local hex
    hex=$(objdump -h "$1" | awk '$2 == "__llvm_covfun" { print $3 }')
    echo $((16#${hex:-0}))
}

# measure_dumps PID SOCKET NAME: $dumps dumps $gap_ms apart into
# $work/t_NAME (the agent's own time to make each report, its
# Server-Timing, into $work/t_NAME.report), the agent's mean CPU per dump
# (ns) into $work/cpu_NAME.
# With NAME "busy", also the memory after the 10th dump (rss_10) and, with
# more dumps 50 ms apart, after the 100th (rss_100), counting the cold one
# (see at_rss).
# The reports are discarded, as bench-busy.sh does: curl's time_total
# includes writing them, and a file would add curl's own time.
measure_dumps() {
    local pid=$1 sock=$2 name=$3 before n=1
    log "$dumps dumps, ${gap_ms} ms apart ($name)"
    before=$(agent_cpu_ns "$pid")
    : >"$work/t_$name"
    : >"$work/t_$name.report"
    for _ in $(seq "$dumps"); do
        sleep_ms "$gap_ms"
        fetch_ms "$sock" /dev/null "" "$work/t_$name.report" >>"$work/t_$name"
        n=$((n + 1))
        [ "$n" -eq 10 ] && [ "$name" = busy ] && at_rss rss_10 "$pid"
    done
    echo $((($(agent_cpu_ns "$pid") - before) / dumps)) >"$work/cpu_$name"
    [ "$name" = busy ] || return 0
    while [ "$n" -lt 100 ]; do
        sleep_ms 50
        dump "$sock" /dev/null >/dev/null
        n=$((n + 1))
        [ "$n" -eq 10 ] && at_rss rss_10 "$pid"
    done
    at_rss rss_100 "$pid"
}

# at_rss NAME PID: rss_kib now as NAME, and the ms since $started (the
# program's start) as NAME_at.
at_rss() {
    printf -v "$1" '%s' "$(rss_kib "$2")"
    printf -v "$1_at" '%s' "$((($(now_ns) - started) / 1000000))"
}
# rss_as_with PID: the readings of the program without the agent, each as
# long after its start ($started) as the one with the agent was:
# rss_none_agent, rss_none_1, rss_none_10, rss_none_100.
rss_as_with() {
    local point at
    for point in agent 1 10 100; do
        at="rss_${point}_at"
        while [ $((($(now_ns) - started) / 1000000)) -lt "${!at}" ]; do sleep 0.05; done
        printf -v "rss_none_$point" '%s' "$(rss_kib "$1")"
    done
}

# run_llvm BIN PROFRAW OUT: LLVM's pipeline, with the agent's filters.
run_llvm() {
    "$profdata" merge -sparse "$2" -o "$work/x.profdata" &&
        "$llvm_cov" export -format=lcov "$1" -instr-profile "$work/x.profdata" \
            "-ignore-filename-regex=$default_ignore" "${agent_ignore[@]}" >"$3"
}

# peer SOCKET BIN: with the program held still, a profraw, one dump and a
# profraw again; llvm-cov's report of each profraw; the LLVM pipeline
# timed. Sets same_moment, identical, t_llvm, and t_profraw (the agent's
# time for the profraw, not in the LLVM time).
peer() {
    local sock=$1 bin=$2 s
    t_profraw=$(dump "$sock" "$work/before.profraw" '?format=profraw')
    dump "$sock" "$work/held.lcov" >/dev/null
    dump "$sock" "$work/after.profraw" '?format=profraw' >/dev/null
    run_llvm "$bin" "$work/before.profraw" "$work/llvm-before.lcov"
    run_llvm "$bin" "$work/after.profraw" "$work/llvm.lcov"
    same_moment=no
    cmp -s "$work/llvm-before.lcov" "$work/llvm.lcov" && same_moment=yes
    identical="no (diff $work/llvm.lcov $work/held.lcov)"
    cmp -s "$work/llvm.lcov" "$work/held.lcov" && identical="yes ($(wc -c <"$work/held.lcov") bytes)"
    log "llvm-profdata merge -sparse + llvm-cov export over the snapshot, $runs timed runs"
    : >"$work/t_llvm"
    for _ in $(seq "$runs"); do
        s=$(now_ns)
        run_llvm "$bin" "$work/after.profraw" "$work/llvm.lcov"
        ms_since "$s" >>"$work/t_llvm"
    done
    t_llvm=$(median <"$work/t_llvm")
}

# The table's rows.
row() { printf "%-66s %10.2f %10.2f\n" "$1" "$2" "$3"; }
# peer_rows: the first dump, and the peer's time (see `peer`).
peer_rows() {
    row1 "first dump (cold), ms" "$t_cold"
    row1 "llvm-profdata + llvm-cov on the same snapshot, ms" "$t_llvm"
    row1 "(the agent's ?format=profraw, not in the LLVM time), ms" "$t_profraw"
}
same_moment_line() {
    echo "same moment (llvm-cov reports the same from both profraws): $same_moment; the held dump is llvm-cov's report byte for byte: $identical"
}
row1() { printf "%-66s %10.2f %10s\n" "$1" "$2" "-"; }
# report_row NAME: the agent's own time to make the reports of
# measure_dumps NAME (the rest of a dump is the connection, the request,
# the transfer and waiting for a CPU).
report_row() { row "  the agent making the report (its Server-Timing), ms" "$(median <"$work/t_$1.report")" "$(p95 <"$work/t_$1.report")"; }
ratio() { awk -v label="$1" -v l="$2" -v d="$3" 'BEGIN { printf "%-66s %9.1fx %10s\n", label, l / d, "-" }'; }
# mem_row POINT LABEL: the readings at POINT (see at_rss, rss_as_with),
# MiB: VmRSS without and with the agent, what it added, of which anonymous.
mem_row() {
    local with="rss_$1" without="rss_none_$1" at="rss_$1_at"
    awk -v label="$2" -v at="${!at}" -v w="${!with}" -v n="${!without}" 'BEGIN {
        split(w, x, "/"); split(n, y, "/")
        printf "%-52s %5.1f %10.1f %8.1f %8.1f %8.1f\n", label, at / 1000, y[1] / 1024, x[1] / 1024,
            (x[1] - y[1]) / 1024, (x[2] - y[2]) / 1024 }'
}
# added_mib POINT: what the agent added at POINT (VmRSS), in MiB.
added_mib() {
    local with="rss_$1" without="rss_none_$1"
    awk -v w="${!with}" -v n="${!without}" 'BEGIN { split(w, x, "/"); split(n, y, "/"); printf "%.1f", (x[1] - y[1]) / 1024 }'
}
memory_table() { # memory_table BIN
    local covfun
    covfun=$(covfun_bytes "$1")
    echo
    printf "%-52s %5s %10s %8s %8s %8s\n" "resident memory (VmRSS), MiB" "at s" "without" "with" "added" "anon"
    mem_row agent "with the agent, before the first dump"
    mem_row 1 "after 1 dump"
    mem_row 10 "after 10 dumps"
    mem_row 100 "after 100 dumps"
    awk -v c="$covfun" -v a="$(added_mib 100)" 'BEGIN {
        printf "%-76s %8.1f\n", sprintf("added after 100 dumps (the binary'"'"'s __llvm_covfun: %.1f MiB)", c / 1048576), a }'
    awk -v a1="$(added_mib 1)" -v a100="$(added_mib 100)" 'BEGIN {
        printf "%-76s %8.1f\n", "growth of what it added, from dump 1 to dump 100", a100 - a1 }'
    # The first dumps after the cold one keep what the functions that run
    # need (see docs/agent.md); after them, what is added is not to grow.
    awk -v a10="$(added_mib 10)" -v a100="$(added_mib 100)" 'BEGIN {
        printf "%-76s %8.1f\n", "growth of what it added, from dump 10 to dump 100", a100 - a10 }'
}

# --- fixtures/large ----------------------------------------------------------------
# start_large NAME yes|no: `large serve --tick-ms`, with the agent or not
# (LIVECOV_DIR unset), its stdin a FIFO this shell holds open (closing it
# ends the process). Sets large_pid, large_fd, large_dir and large_sock.
start_large() {
    local name=$1 env=(LLVM_PROFILE_FILE="$work/large-$1/exit-%p.profraw")
    large_dir="$work/large-$name"
    [ "$2" = yes ] && env+=(LIVECOV_DIR="$large_dir/cov" LIVECOV_DEMANGLE=0)
    mkdir -p "$large_dir"
    mkfifo "$large_dir/stdin"
    "${clean_env[@]}" "${env[@]}" \
        "$work/large" serve --inputs "$root/fixtures/large/inputs" --scratch "$large_dir/scratch" --tick-ms "$large_tick_ms" \
        <"$large_dir/stdin" >"$large_dir/stdout" 2>"$large_dir/stderr" &
    large_pid=$!
    pids+=("$large_pid")
    exec {large_fd}<>"$large_dir/stdin"   # read-write: never blocks
    wait_for 1200 grep -qx 'large serve: ready' "$large_dir/stdout" || die "large serve did not get ready ($large_dir/stderr)"
    [ "$2" = yes ] || return 0
    wait_for 100 eval "ls '$large_dir'/cov/sockets/rust-$large_pid-*.sock >/dev/null 2>&1" || die "no agent socket"
    large_sock=$(ls "$large_dir"/cov/sockets/rust-"$large_pid"-*.sock)
}
stop_large() {
    exec {large_fd}>&-
    stop "$large_pid"
}

log "fixtures/large serve --tick-ms $large_tick_ms with the agent"
start_large agent yes
started=$(now_ns)
default_ignore=$(sed -n 's/^livecov-default-ignore: //p' "$large_dir/stdout")
[ -n "$default_ignore" ] || die "large serve did not print the agent's default ignore pattern"
sleep 1
at_rss rss_agent "$large_pid"
t_cold=$(dump "$large_sock" "$work/cold.lcov")
at_rss rss_1 "$large_pid"
measure_dumps "$large_pid" "$large_sock" busy
log "the peer: the ticker held (hold on stdin)"
echo hold >&"$large_fd"
wait_for 300 grep -qx 'large serve: held' "$large_dir/stdout" || die "large serve did not hold its ticker"
peer "$large_sock" "$work/large"
echo release >&"$large_fd"
stop_large
log "fixtures/large serve --tick-ms $large_tick_ms without the agent (its memory at the same times)"
start_large none no
started=$(now_ns)
rss_as_with "$large_pid"
stop_large
large_reported=$(grep -c '^SF:' "$work/held.lcov")
large_functions=$(grep -c '^FN:' "$work/held.lcov")
p50=$(median <"$work/t_busy")

echo
echo "busy Rust program 1: fixtures/large serve --tick-ms $large_tick_ms (bench.sh's workload, then one of its commands again every tick),"
echo "$label linked in, LIVECOV_DEMANGLE=0; its report: $large_reported files, $large_functions functions (the agent's default LIVECOV_IGNORE"
echo "leaves out std, registry and git dependencies: llvm-cov gets -ignore-filename-regex for them and for the agent's own sources);"
echo "dumps ${gap_ms} ms apart, curl time_total over the Unix socket; peer: llvm-profdata merge -sparse + llvm-cov export (LLVM 22)"
echo "over the same snapshot, median of $runs; load after: $(load) on $(nproc) CPUs"
printf "%-66s %10s %10s\n" "what" "p50" "p95"
row "dump with the ticker running, ms ($dumps)" "$p50" "$(p95 <"$work/t_busy")"
report_row busy
row1 "agent CPU per dump (mean, schedstat of livecov* threads), ms" "$(awk '{ print $1 / 1e6 }' "$work/cpu_busy")"
peer_rows
ratio "ratio: peer / dump with the ticker (p50)" "$t_llvm" "$p50"
same_moment_line
memory_table "$work/large"

# --- fixtures/service ------------------------------------------------------------------
port=""
# start_service NAME yes|no: the service with SERVICE_TICK_MS, with the
# agent or not (LIVECOV_DIR unset). Sets service_pid, port, service_sock.
start_service() {
    local dir="$work/service-$1"
    local env=(SERVICE_TICK_MS="$tick_ms" LLVM_PROFILE_FILE="$dir/exit-%p.profraw")
    [ "$2" = yes ] && env+=(LIVECOV_DIR="$dir/cov" LIVECOV_DEMANGLE=0)
    mkdir -p "$dir"
    "${clean_env[@]}" "${env[@]}" \
        "$work/service" --addr 127.0.0.1:0 >"$dir/stdout" 2>"$dir/stderr" </dev/null &
    service_pid=$!
    pids+=("$service_pid")
    wait_for 300 grep -q '^listening on ' "$dir/stdout" || die "the service did not start ($dir/stderr)"
    port=$(sed -n 's/^listening on .*://p' "$dir/stdout")
    [ "$2" = yes ] || return 0
    wait_for 100 eval "ls '$dir'/cov/sockets/rust-$service_pid-*.sock >/dev/null 2>&1" || die "no agent socket"
    service_sock=$(ls "$dir"/cov/sockets/rust-"$service_pid"-*.sock)
}
stop_service() {
    curl -s --max-time 10 "http://127.0.0.1:$port/quit" >/dev/null || true
    stop "$service_pid"
}
cat >"$work/mix.lua" <<'EOF'
-- The service's endpoints in turn.
local paths = { "/fib?n=20", "/hello?name=bench", "/primes?limit=500" }
local i = 0
request = function()
    i = i % #paths + 1
    return wrk.format("GET", paths[i])
end
EOF
# traffic SECONDS: wrk in the background, bounded by its duration.
traffic() {
    wrk -t1 -c4 -d"$1s" --timeout 5s -s "$work/mix.lua" "http://127.0.0.1:$port/" >"$work/wrk-traffic" 2>&1 &
    traffic_pid=$!
    pids+=("$traffic_pid")
}
end_traffic() {
    kill "$traffic_pid" 2>/dev/null || true
    wait "$traffic_pid" 2>/dev/null || true
    forget "$traffic_pid"
}
cpu_ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }   # utime + stime
# wrk_rps SECS OUT [CPU_OUT]: requests/s of the mix; with CPU_OUT, appends
# the service's CPU time per request (µs; its ticker and agent included), a
# figure that other work on the machine skews far less.
wrk_rps() {
    local before
    before=$(cpu_ticks "$service_pid")
    wrk -t1 -c4 -d"$1s" --timeout 5s -s "$work/mix.lua" "http://127.0.0.1:$port/" >"$2" 2>&1 || die "wrk failed ($2)"
    if [ -n "${3:-}" ]; then
        awk -v t=$(($(cpu_ticks "$service_pid") - before)) -v hz="$(getconf CLK_TCK)" \
            '/ requests in / { printf "%.1f\n", t / hz * 1e6 / $1 }' "$2" >>"$3"
    fi
    awk '/^Requests\/sec:/ { print $2 }' "$2"
}

log "fixtures/service SERVICE_TICK_MS=$tick_ms with the agent, wrk sending requests"
start_service agent yes
started=$(now_ns)
traffic 600
sleep 1
at_rss rss_agent "$service_pid"
t_cold=$(dump "$service_sock" "$work/cold.lcov")
at_rss rss_1 "$service_pid"
measure_dumps "$service_pid" "$service_sock" busy
end_traffic
sleep 0.5
measure_dumps "$service_pid" "$service_sock" ticker
log "the peer: the service held (/hold)"
curl -s --max-time 30 "http://127.0.0.1:$port/hold?ms=5000" >"$work/hold.out" &
hold_pid=$!
pids+=("$hold_pid")
sleep 0.5
peer "$service_sock" "$work/service"
wait "$hold_pid" || die "GET /hold failed"
forget "$hold_pid"
grep -q '^held ' "$work/hold.out" || die "GET /hold said $(head -c 200 "$work/hold.out")"

log "throughput: $rounds x (${load_secs} s without dumps, ${load_secs} s with a dump every 100 ms)"
wrk_rps 2 "$work/wrk-warmup" >/dev/null
# One curl for all the dumps of a round, 10 a second (--rate), each one's time.
dumper_args=()
for _ in $(seq $((load_secs * 10))); do dumper_args+=(-o /dev/null localhost/coverage); done
: >"$work/rps_none"; : >"$work/rps_dumps"; : >"$work/t_loop"; : >"$work/cpu_req_none"; : >"$work/cpu_req_dumps"
for r in $(seq "$rounds"); do
    wrk_rps "$load_secs" "$work/wrk-none-$r" "$work/cpu_req_none" >>"$work/rps_none"
    timeout $((load_secs + 60)) curl -s --max-time 60 --rate 10/s --unix-socket "$service_sock" -w '%{time_total}\n' \
        "${dumper_args[@]}" >"$work/t_loop-$r" 2>/dev/null &
    dumper=$!
    pids+=("$dumper")
    wrk_rps "$load_secs" "$work/wrk-dumps-$r" "$work/cpu_req_dumps" >>"$work/rps_dumps"
    wait "$dumper" 2>/dev/null || true
    forget "$dumper"
    awk '{ printf "%.3f\n", $1 * 1000 }' "$work/t_loop-$r" >>"$work/t_loop"
done
stop_service
log "fixtures/service SERVICE_TICK_MS=$tick_ms without the agent (its memory under traffic at the same times)"
start_service none no
started=$(now_ns)
traffic 600
rss_as_with "$service_pid"
end_traffic
stop_service
service_reported=$(grep -c '^SF:' "$work/held.lcov")
p50=$(median <"$work/t_busy")
p50_ticker=$(median <"$work/t_ticker")

echo
echo "busy Rust program 2: fixtures/service, SERVICE_TICK_MS=$tick_ms (a thread recomputes a status with the handlers every tick),"
echo "$label linked in, LIVECOV_DEMANGLE=0; wrk -t1 -c4 (/fib, /hello, /primes in turn) during the first dumps;"
echo "its report: $service_reported files (std and dependencies left out by the agent's default LIVECOV_IGNORE: llvm-cov gets"
echo "-ignore-filename-regex for them and for the agent's own sources); dumps ${gap_ms} ms apart, curl time_total over the"
echo "Unix socket; peer: llvm-profdata merge -sparse + llvm-cov export (LLVM 22) over the same snapshot, median of $runs;"
echo "load after: $(load) on $(nproc) CPUs"
printf "%-66s %10s %10s\n" "what" "p50" "p95"
row "dump under traffic, ticker running, ms ($dumps)" "$p50" "$(p95 <"$work/t_busy")"
report_row busy
row "dump with the ticker only, ms ($dumps)" "$p50_ticker" "$(p95 <"$work/t_ticker")"
report_row ticker
row1 "agent CPU per dump under traffic (mean, schedstat of livecov*), ms" "$(awk '{ print $1 / 1e6 }' "$work/cpu_busy")"
row1 "agent CPU per dump with the ticker only (mean), ms" "$(awk '{ print $1 / 1e6 }' "$work/cpu_ticker")"
peer_rows
ratio "ratio: peer / dump under traffic (p50)" "$t_llvm" "$p50"
ratio "ratio: peer / dump with the ticker only (p50)" "$t_llvm" "$p50_ticker"
same_moment_line
memory_table "$work/service"
echo
printf "%-66s %10s %11s\n" "throughput, wrk -t1 -c4 ${load_secs} s, ticker running, median of $rounds" "req/s" "CPU µs/req"
printf "%-66s %10.1f %10.1f\n" "with the agent, no dumps" "$(median <"$work/rps_none")" "$(median <"$work/cpu_req_none")"
printf "%-66s %10.1f %10.1f\n" "$(printf "with a dump every 100 ms (%d dumps: p50 %.2f ms, p95 %.2f ms)" "$(wc -l <"$work/t_loop")" \
    "$(median <"$work/t_loop")" "$(p95 <"$work/t_loop")")" "$(median <"$work/rps_dumps")" "$(median <"$work/cpu_req_dumps")"
echo "   per round, req/s without: $(paste -sd' ' "$work/rps_none"); with dumps: $(paste -sd' ' "$work/rps_dumps")"

# --- mini-redis -------------------------------------------------------------------
# start_mini_redis NAME yes|no: the server, with the agent or not (LIVECOV_DIR
# unset). Sets mr_pid, mr_port, mr_sock.
start_mini_redis() {
    local dir="$work/mini-redis-$1" env=(LLVM_PROFILE_FILE="$work/mini-redis-$1/exit-%p.profraw")
    [ "$2" = yes ] && env+=(LIVECOV_DIR="$dir/cov" LIVECOV_DEMANGLE=0)
    mkdir -p "$dir"
    mr_port=$(free_port)
    "${clean_env[@]}" "${env[@]}" "$work/mini-redis-server" --port "$mr_port" >"$dir/stdout" 2>"$dir/stderr" </dev/null &
    mr_pid=$!
    pids+=("$mr_pid")
    wait_for 300 eval "(: >/dev/tcp/127.0.0.1/$mr_port) 2>/dev/null" || die "mini-redis did not start ($dir/stderr)"
    [ "$2" = yes ] || return 0
    wait_for 100 eval "ls '$dir'/cov/sockets/rust-$mr_pid-*.sock >/dev/null 2>&1" || die "no agent socket"
    mr_sock=$(ls "$dir"/cov/sockets/rust-"$mr_pid"-*.sock)
}
# SETs that expire in 5 ms, and GETs of the same keys, until end_mr_traffic.
mr_traffic() {
    redis-benchmark -p "$mr_port" -q -l -c 2 -r 1000 SET 'key:__rand_int__' v PX 5 >/dev/null 2>&1 &
    mr_set=$!
    redis-benchmark -p "$mr_port" -q -l -c 2 -r 1000 GET 'key:__rand_int__' >/dev/null 2>&1 &
    mr_get=$!
    pids+=("$mr_set" "$mr_get")
}
end_mr_traffic() {
    kill "$mr_set" "$mr_get" 2>/dev/null || true
    wait "$mr_set" "$mr_get" 2>/dev/null || true
    forget "$mr_set"
    forget "$mr_get"
}

log "$mini_redis with the agent, redis-benchmark sending SET PX 5 and GET"
start_mini_redis agent yes
started=$(now_ns)
mr_traffic
sleep 1
at_rss rss_agent "$mr_pid"
t_cold=$(dump "$mr_sock" "$work/cold.lcov")
at_rss rss_1 "$mr_pid"
measure_dumps "$mr_pid" "$mr_sock" busy
end_mr_traffic
log "the peer: the server quiet (no traffic, the last keys expired)"
sleep 0.5
peer "$mr_sock" "$work/mini-redis-server"
kill "$mr_pid"
stop "$mr_pid"
log "curl's floor: the report's bytes from a trivial server, the same traffic against $mini_redis without the agent (and its memory at the same times)"
start_mini_redis floor no
started=$(now_ns)
mr_traffic
( sleep 1; rss_as_with "$mr_pid"; declare -p rss_none_agent rss_none_1 rss_none_10 rss_none_100 >"$work/rss_none" ) &
rss_reader=$!
pids+=("$rss_reader")
serve_file "$work/floor.sock" "$work/held.lcov"
pids+=("$floor_pid")
sleep 1
floor_times "$work/floor.sock" "$dumps" "$gap_ms" >"$work/t_floor"
wait "$rss_reader" || die "the memory of $mini_redis without the agent was not read"
forget "$rss_reader"
source "$work/rss_none"
kill "$floor_pid" 2>/dev/null || true
end_mr_traffic
kill "$mr_pid"
stop "$mr_pid"
mr_reported=$(grep -c '^SF:' "$work/held.lcov")
p50=$(median <"$work/t_busy")

echo
echo "busy Rust program 3: $mini_redis from crates.io (nobody here wrote it), its Cargo.lock as published, the agent added"
echo "(livecov::start() in main), $label, LIVECOV_DEMANGLE=0; redis-benchmark -c 2 SET key PX 5 and -c 2 GET, the server's"
echo "task purging expired keys; its report: $mr_reported files; dumps ${gap_ms} ms apart, curl time_total over the Unix socket;"
echo "peer: llvm-profdata merge -sparse + llvm-cov export (LLVM 22) over the same snapshot, median of $runs;"
echo "load after: $(load) on $(nproc) CPUs"
printf "%-66s %10s %10s\n" "what" "p50" "p95"
row "dump under traffic, ms ($dumps)" "$p50" "$(p95 <"$work/t_busy")"
report_row busy
row "its bytes from a trivial server, same traffic (floor), ms" "$(median <"$work/t_floor")" "$(p95 <"$work/t_floor")"
row1 "agent CPU per dump under traffic (mean, schedstat of livecov*), ms" "$(awk '{ print $1 / 1e6 }' "$work/cpu_busy")"
peer_rows
ratio "ratio: peer / dump under traffic (p50)" "$t_llvm" "$p50"
same_moment_line
memory_table "$work/mini-redis-server"
