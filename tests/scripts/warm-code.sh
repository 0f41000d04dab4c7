#!/usr/bin/env bash
# Writes agent-native/warm-code.ld: the functions of liblivecov.so that
# warm dumps run, found by running them, so that the linker lays them side
# by side (see that file for why).
#
# How: a uprobe on the entry of every function of liblivecov
# (release-native, symbols kept), which then is preloaded into a busy
# redis (tests/scripts/deps-redis.sh, redis-benchmark running); a first
# dump, then 40 dumps of what a test run and a collector ask (LCOV and
# `format=counters`, over the Unix socket and TCP), 125 ms apart. The
# functions whose calls (/sys/kernel/tracing/uprobe_profile) grew over
# those 40 are the warm ones: among them those that make the record of a
# file whose functions run for the first time since the first dump. The
# threads' own functions, entered once at start, are added by name. Names
# are written without their hashes (and crate disambiguators), so that
# the list goes on matching the functions it named as the code around
# them changes; run this again when warm code is added (`native.rs`
# checks what stays resident after warm dumps).
#
# Needs root and tracefs (uprobes); a few minutes (a probe hit costs a
# trap, and warm dumps call these functions millions of times). Loopback
# only.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
source "$root/tests/scripts/bench-common.sh"
log() { echo "warm-code: $*" >&2; }
die() { log "$*"; exit 1; }
install_tools curl=curl ss=iproute2 nm=binutils readelf=binutils
tracing=/sys/kernel/tracing
[ -w "$tracing/uprobe_events" ] || die "$tracing/uprobe_events is not writable (run as root, with tracefs mounted)"

work="$root/target/warm-code"
log "building liblivecov (release-native, symbols kept)"
"${clean_env[@]}" CARGO_TARGET_DIR="$work/target" CARGO_PROFILE_RELEASE_NATIVE_STRIP=false \
    cargo build --quiet -p livecov-native --profile release-native || die "the build of liblivecov failed"
# Named otherwise than liblivecov*.so, the agent keeps its pages of code
# (see agent-native/src/own_module.rs): given back, they would be mapped
# again from the file, without the uprobes' breakpoints.
lib="$work/probed.so"
cp "$work/target/release-native/liblivecov.so" "$lib"

"$root/tests/scripts/deps-redis.sh" >&2 || die "tests/scripts/deps-redis.sh failed"
bin="$work/bin"
mkdir -p "$bin"
for b in redis-server redis-benchmark redis-cli; do cp "$root/target/redis/current/src/src/$b" "$bin/$b"; done
cov=$(mktemp -d "${TMPDIR:-/tmp}/livecov-warm.XXXXXX")
group=livecov_warm
pids=()
remove_probes() {
    [ -d "$tracing/events/$group" ] || return 0
    local e
    for e in "$tracing/events/$group"/f[0-9]*; do
        echo 0 >"$e/enable" 2>/dev/null || true
        echo "-:$group/${e##*/}" >>"$tracing/uprobe_events" 2>/dev/null || true
    done
}
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    remove_probes
    rm -rf "$cov"
}
trap cleanup EXIT

# A probe on the entry of each function, set before the program maps the
# library: its offset in the file, from the executable segment's address
# and offset.
read -r seg_offset seg_address < <(readelf -lW "$lib" | awk '$1 == "LOAD" && $8 == "E" { print $2, $3; exit }')
nm --defined-only "$lib" | awk '$2 == "t" || $2 == "T" { print $1, $3 }' | sort -u -k1,1 >"$work/functions"
log "$(wc -l <"$work/functions") functions: a uprobe on each"
n=0
while read -r address _; do
    n=$((n + 1))
    printf 'p:%s/f%d %s:0x%x\n' "$group" "$n" "$lib" $((16#$address - seg_address + seg_offset))
done <"$work/functions" >"$work/probes"
remove_probes
failed=0
# One definition a write: the kernel takes no more.
while read -r probe; do echo "$probe" >>"$tracing/uprobe_events" 2>/dev/null || failed=$((failed + 1)); done <"$work/probes"
[ "$failed" -eq 0 ] || die "$failed probes could not be defined"
# Those the kernel will not probe (an entry instruction it cannot step
# over, such as a locked one: tiny functions, a waker's reference count)
# are taken as warm. It says so only when a process maps the library:
# one does while they are enabled (the agent does not start in it).
LD_PRELOAD="$lib" sleep 60 >/dev/null 2>&1 &
holder=$!
pids+=("$holder")
wait_for 50 grep -q "$lib" "/proc/$holder/maps" || die "no process mapped $lib"
: >"$work/unprobed"
for e in "$tracing/events/$group"/f[0-9]*; do
    echo 1 >"$e/enable" 2>/dev/null || echo "${e##*/f}" >>"$work/unprobed"
done
kill "$holder"
log "$(wc -l <"$work/unprobed") functions could not be probed: taken as warm"

port=$(free_port)
agent_port=$(free_port)
LLVM_PROFILE_FILE="$work/server-%p.profraw" LD_PRELOAD="$lib" LIVECOV_DIR="$cov/dir" LIVECOV_LISTEN="127.0.0.1:$agent_port" \
    "$bin/redis-server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --logfile "" \
    >"$work/server.log" 2>&1 </dev/null &
pids+=($!)
wait_for 300 env LLVM_PROFILE_FILE="$work/clients-%p.profraw" "$bin/redis-cli" -p "$port" ping >/dev/null 2>&1 ||
    die "redis-server did not start ($work/server.log)"
wait_for 300 bash -c "ls '$cov/dir/sockets/'*.sock >/dev/null 2>&1" || die "no agent socket"
socket=$(ls "$cov/dir/sockets/"*.sock)
LLVM_PROFILE_FILE="$work/clients-%p.profraw" timeout 600 "$bin/redis-benchmark" -p "$port" -q -l -c 4 \
    -t set,get,incr,lpush,lpop,hset,lrange_100 -r 10000 >/dev/null 2>&1 &
pids+=($!)
sleep 1
queries=(coverage "coverage?format=counters")
for q in "${queries[@]}"; do
    curl -sf --max-time 60 --unix-socket "$socket" -o /dev/null "localhost/$q" || die "the first dump failed"
done
# calls: "N COUNT" of each probe fN, from its line "FILE fN COUNT".
calls() { awk '{ sub(/^f/, "", $2); print $2, $3 }' "$tracing/uprobe_profile"; }
calls >"$work/before"
log "40 dumps, of every kind"
for _ in $(seq 10); do
    for q in "${queries[@]}"; do
        sleep 0.125
        curl -s --max-time 60 --unix-socket "$socket" -o /dev/null "localhost/$q" || true
        sleep 0.125
        curl -s --max-time 60 -o /dev/null "http://127.0.0.1:$agent_port/$q" || true
    done
done
calls >"$work/after"
remove_probes

# The warm functions' names, without hashes: legacy names end in
# `17h<16 hex>E`; v0 names carry crate disambiguators (`Cs<base62>_`).
awk 'FILENAME == ARGV[1] { before[$1] = $2; next }
     FILENAME == ARGV[2] { if ($2 > before[$1]) warm[$1] = 1; next }
     FILENAME == ARGV[3] { warm[$1] = 1; next }
     warm[FNR] { print $2 }' "$work/before" "$work/after" "$work/unprobed" "$work/functions" >"$work/warm"
log "$(wc -l <"$work/warm") functions ran in warm dumps"
{
    cat "$work/warm"
    # Each thread's own function (entered once, at its start).
    echo "_ZN3std3sys9backtrace28__rust_begin_short_backtrace17h0000000000000000E"
} | sed -E 's/17h[0-9a-f]{16}E$/17h*/; s/Cs[0-9A-Za-z]+_/Cs*_/g' | LC_ALL=C sort -u >"$work/patterns"

# What the server's thread runs from giving the agent's code back (once
# idle after a dump: agent-native/src/own_module.rs) until it waits for
# work, and while it waits: first, in one run of pages, the only one that
# then stays mapped. Found with `perf record -e page-faults -d` on that
# thread after a dump, each function that faulted added in turn; tokio's
# and mio's own functions whole (55 KiB). With them, what the program's
# own threads run of the library between dumps: the close calls the shim
# answers (agent-native/src/close.rs), and the list of the agent's
# descriptors they read.
idle=(
    'close'
    'close_range'
    'closefrom'
    '_ZN7livecov5agent11descriptors*'
    '_ZN7livecov10own_module18release_code_pages17h*'
    '_ZN7livecov5agent6server5spawn28_$u7b$$u7b$closure$u7d$$u7d$17h*'
    '_ZN3std3sys9backtrace28__rust_begin_short_backtrace17h*'
    '_ZN87_$LT$livecov..allocator..AgentAllocator$u20$as$u20$core..alloc..global..GlobalAlloc$GT$5alloc17h*'
    '_ZN87_$LT$livecov..allocator..AgentAllocator$u20$as$u20$core..alloc..global..GlobalAlloc$GT$7dealloc17h*'
    '_ZN7livecov7scratch5alloc17h*'
    '_ZN5tokio*'
    '_ZN3mio*'
    'ScheduledIo*'
    '_ZN5alloc4sync16Arc$LT$T$C$A$GT$9drop_slow17h*'
)

out="$root/agent-native/warm-code.ld"
{
    cat <<'EOF'
/* The code of liblivecov.so that warm dumps run, side by side, ahead of
   the rest (passed with -T; INSERT keeps the linker's own layout for
   everything else). Written by tests/scripts/warm-code.sh, which runs
   dumps (LCOV and counters, over the Unix socket and TCP) of a busy redis
   and lists the functions they call.

   The kernel maps a file's pages in runs (64 KiB, or a large folio)
   around each one touched. Each dump maps again the code it runs (the
   server gives it back once idle: agent-native/src/own_module.rs), side
   by side in fewer runs: spread over the library's code, the 0.5 MiB that
   warm dumps run mapped 1.2 MiB of it on redis under traffic; side by
   side, 0.8 MiB. First comes what the server's thread runs after giving
   the code back, the one run that stays between dumps (108 KiB on redis),
   and what the program's own threads run of the library (the close calls).
   Functions are matched by their names without hashes (all the instances
   of a generic one), in any `.text.*` section (LLVM puts those it deems
   cold in `.text.unlikely.`). */
SECTIONS {
  .text.warm : {
EOF
    printf '    *(.text.*%s)\n' "${idle[@]}"
    sed 's/.*/    *(.text.*&)/' "$work/patterns"
    cat <<'EOF'
  }
} INSERT BEFORE .text;
EOF
} >"$out"
log "wrote $out ($(wc -l <"$work/patterns") patterns)"
