#!/usr/bin/env bash
# Writes agent-native/warm-code.ld: the functions of liblivecov.so that
# warm dumps run, found by running them, so that the linker lays them side
# by side (see that file for why).
#
# How: liblivecov (release-native, symbols kept) preloaded into a busy
# redis (tests/scripts/deps-redis.sh, redis-benchmark running), a first
# dump, then dumps every 250 ms of what a test run and a collector ask
# (LCOV and `format=counters`, over the Unix socket and TCP). A uprobe on
# the entry of every function of the library counts its calls
# (/sys/kernel/tracing/uprobe_profile) over the next 40 dumps: those
# called are the warm ones. The threads' own functions, entered once at
# start, are added by name. Names are written without their hashes (and
# crate disambiguators), so that the list goes on matching the functions
# it named as the code around them changes; run this again when warm
# code is added (`native.rs` checks what stays resident after warm dumps).
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
lib="$work/liblivecov.so"
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

port=$(free_port)
agent_port=$(free_port)
LLVM_PROFILE_FILE="$work/server-%p.profraw" LD_PRELOAD="$lib" LIVECOV_DIR="$cov/dir" LIVECOV_LISTEN="127.0.0.1:$agent_port" \
    "$bin/redis-server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --logfile "" \
    >"$work/server.log" 2>&1 </dev/null &
pids+=($!)
wait_for 100 "$bin/redis-cli" -p "$port" ping >/dev/null 2>&1 || die "redis-server did not start ($work/server.log)"
wait_for 100 bash -c "ls '$cov/dir/sockets/'*.sock >/dev/null 2>&1" || die "no agent socket"
socket=$(ls "$cov/dir/sockets/"*.sock)
LLVM_PROFILE_FILE="$work/clients-%p.profraw" timeout 600 "$bin/redis-benchmark" -p "$port" -q -l -c 4 \
    -t set,get,incr,lpush,lpop,hset,lrange_100 -r 10000 >/dev/null 2>&1 &
pids+=($!)
sleep 1
queries=(coverage "coverage?format=counters")
for q in "${queries[@]}"; do
    curl -sf --max-time 30 --unix-socket "$socket" -o /dev/null "localhost/$q" || die "the first dump failed"
done
# Dumps of every kind until the end, closer than the agent's rest (a
# rest gives the pages of code back, and the uprobes' breakpoints with
# them).
(
    for _ in $(seq 2000); do
        for q in "${queries[@]}"; do
            sleep 0.125
            curl -s --max-time 30 --unix-socket "$socket" -o /dev/null "localhost/$q" || true
            sleep 0.125
            curl -s --max-time 30 -o /dev/null "http://127.0.0.1:$agent_port/$q" || true
        done
    done
) &
pids+=($!)

# A probe on the entry of each function: its offset in the file, from the
# executable segment's address and offset.
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
# Those the kernel will not probe (an entry instruction it cannot step
# over, such as a locked one: tiny functions, a waker's reference count)
# are taken as warm.
: >"$work/unprobed"
for e in "$tracing/events/$group"/f[0-9]*; do
    echo 1 >"$e/enable" 2>/dev/null || echo "${e##*/f}" >>"$work/unprobed"
done
[ "$failed" -eq 0 ] || die "$failed probes could not be defined"
log "$(wc -l <"$work/unprobed") functions could not be probed: taken as warm"
sleep 2
# calls: "N COUNT" of each probe fN, from its line "FILE fN COUNT".
calls() { awk '{ sub(/^f/, "", $2); print $2, $3 }' "$tracing/uprobe_profile"; }
calls >"$work/before"
log "40 dumps"
sleep 10
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

out="$root/agent-native/warm-code.ld"
{
    cat <<'EOF'
/* The code of liblivecov.so that warm dumps run, side by side, ahead of
   the rest (passed with -T; INSERT keeps the linker's own layout for
   everything else). Written by tests/scripts/warm-code.sh, which runs
   dumps (LCOV and counters, over the Unix socket and TCP) of a busy redis
   and lists the functions they call.

   Between dumps that follow each other the code a dump runs stays
   resident in the program, and the kernel maps a file's pages 64 KiB at a
   time around each one touched: spread over the library's code, the 0.5
   MiB that warm dumps run kept 1.2 MiB of it resident on redis under
   traffic; side by side, 0.8 MiB. Functions are matched by their names
   without hashes (all the instances of a generic one), in any `.text.*`
   section (LLVM puts those it deems cold in `.text.unlikely.`). */
SECTIONS {
  .text.warm : {
EOF
    sed 's/.*/    *(.text.*&)/' "$work/patterns"
    cat <<'EOF'
  }
} INSERT BEFORE .text;
EOF
} >"$out"
log "wrote $out ($(wc -l <"$work/patterns") patterns)"
