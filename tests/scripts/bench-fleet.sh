#!/usr/bin/env bash
# Benchmarks collecting a fleet: 48 replicas of a real C server, redis from
# Debian's source package built with clang-19 and coverage
# (tests/scripts/deps-redis.sh), liblivecov.so preloaded into each, against
# the LLVM tools over the same replicas' raw profiles, side by side in one run.
#
# - Replicas: redis-server on 127.0.0.2 .. 127.0.0.49 (one port shared, no
#   persistence), each with LD_PRELOAD=liblivecov.so, its agent on
#   LIVECOV_LISTEN=127.0.0.N:PORT (one port shared; loopback, so no token) and
#   a LIVECOV_DIR of its own; all of them behind one DNS name served by
#   dnsmasq on a loopback port; a second name has the first replica only.
# - Traffic: redis-benchmark of the same build, different commands, key
#   spaces, value sizes, pipelining and counts per replica (so every replica
#   has counts of its own), each run bounded in requests and in time.
# - The same moment: `DEBUG SLEEP` holds every replica's main thread (the
#   agent answers from a thread of its own), so nothing counts while the
#   collects and the raw profiles are taken; the raw profiles are taken
#   before and after, and must be the same bytes.
# - livecov (release build), during that moment, in each merge mode it has
#   (the exact merge: the default, or --exact in its first versions; and the
#   LCOV merge: --lcov-merge, or the default before; the exact one first):
#   a cold `livecov collect --replicas dns:NAME:PORT --dns-server ...` of
#   all replicas (the agents' first dump of that kind), then BENCH_RUNS
#   warm ones (default 3) and as many of the one replica, interleaved; wall
#   time around the command, peak RSS from /usr/bin/time; a `livecov
#   sidecar` per mode (no --poll-interval: each GET /coverage asks every
#   replica) answering GET /coverage once too; the manifest's exact groups.
# - The peer: what the LLVM tools need for the same report: every replica's
#   GET /coverage?format=profraw (curl, 16 at once, as collect's default
#   --parallelism), `llvm-profdata merge -sparse` and `llvm-cov export
#   -format=lcov` of LLVM 22 (rustup's llvm-tools) with the binary; its
#   output is the oracle: each merged report is diffed against it.
# - Then the sidecars under traffic: the replicas take redis-benchmark
#   traffic (bounded rounds) while GET /coverage is asked BENCH_FLEET_REQUESTS
#   times (default 12) of each, one after another: p50/p95 of the response
#   time, peak RSS (VmHWM), and the peer's pipeline under the same traffic.
# BENCH_FLEET_REV=COMMIT measures that commit's livecov instead of the
# checkout's (e.g. before and after a change); BENCH_FLEET_REPLICAS (48),
# BENCH_FLEET_FREEZE (seconds held still, 60).
# Prints progress on stderr, the table on stdout. Every loop is bounded;
# traffic goes to 127.0.0.0/8 only; every process started here is ended on
# exit. Run from anywhere, or at the end of `make bench`. Not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-3}
[ "$runs" -ge 3 ] || runs=3   # the median of at least 3
[ "$runs" -le 9 ] || runs=9
replicas=${BENCH_FLEET_REPLICAS:-48}
requests=${BENCH_FLEET_REQUESTS:-12}
freeze_s=${BENCH_FLEET_FREEZE:-60}   # seconds the replicas are held still
[ "$replicas" -ge 1 ] && [ "$replicas" -le 250 ] || { echo "bench-fleet: BENCH_FLEET_REPLICAS must be 1..250" >&2; exit 2; }
[ "$requests" -ge 2 ] && [ "$requests" -le 100 ] || { echo "bench-fleet: BENCH_FLEET_REQUESTS must be 2..100" >&2; exit 2; }
[ "$freeze_s" -ge 5 ] && [ "$freeze_s" -le 300 ] || { echo "bench-fleet: BENCH_FLEET_FREEZE must be 5..300" >&2; exit 2; }
log() { echo "bench-fleet: $*" >&2; }
die() { echo "bench-fleet: $*" >&2; exit 1; }

# --- tools -------------------------------------------------------------------
source "$root/tests/scripts/bench-common.sh"
install_tools /usr/bin/time=time dnsmasq=dnsmasq curl=curl jq=jq ss=iproute2 flock=util-linux

# --- builds ------------------------------------------------------------------
# BENCH_FLEET_REV=COMMIT measures livecov and liblivecov of that commit (its
# files from `git archive`, built in target/bench-fleet-rev), e.g. to compare
# with an older one; by default the checkout's own files.
sources_of "${BENCH_FLEET_REV:-}" bench-fleet
livecov_label="livecov $rev_label"
log "building $livecov_label (release) and liblivecov (release-native)"
(
    cd "$src"
    "${clean_env[@]}" CARGO_TARGET_DIR="$build_dir" cargo build --release --quiet -p livecov-cli
    "${clean_env[@]}" CARGO_TARGET_DIR="$build_dir" cargo build --quiet -p livecov-native --profile release-native
) || die "the build of livecov failed"
livecov="$build_dir/release/livecov"
preload="$build_dir/release-native/liblivecov.so"
[ -x "$livecov" ] && [ -f "$preload" ] || die "$livecov or $preload missing after the build"

log "redis from Debian's source package, clang-19 coverage (tests/scripts/deps-redis.sh; built once per version and flags)"
s=$(now_ns)
"$root/tests/scripts/deps-redis.sh" >&2 || die "tests/scripts/deps-redis.sh failed"
log "deps-redis.sh took $(( ($(now_ns) - s) / 1000000 )) ms (a cached build is not built again)"
redis_build=$(readlink "$root/target/redis/current")
redis_src="$root/target/redis/current/src/src"

work="$root/target/bench-fleet"
rm -rf "$work"
mkdir -p "$work/bin" "$work/replicas" "$work/collect" "$work/profraw" "$work/out"
# Copies: the agents read the coverage mapping from the running executable's
# file, which must not change under them; llvm-cov reads the same copy.
for b in redis-server redis-benchmark redis-cli; do cp "$redis_src/$b" "$work/bin/$b"; done
server="$work/bin/redis-server"
# Agent sockets live in LIVECOV_DIR/sockets: Unix socket paths are limited
# to 107 bytes, so a short folder of their own, whatever the checkout's path.
covs=$(mktemp -d "${TMPDIR:-/tmp}/livecov-fleet.XXXXXX")
# The clients are instrumented too: their profiles go to one merged file
# each (%1m: one pool file, merged online), out of the way.
clients_profile="$work/clients-%1m.profraw"

# --- processes: every one started here is ended on exit -------------------------
pids=()
traffic_pid=""
cleanup() {
    local p live=() running
    if [ -n "$traffic_pid" ]; then   # the traffic loop ends at its next step (each is bounded to 10 s)
        touch "$work/traffic.stop" 2>/dev/null || true
        for _ in $(seq 150); do kill -0 "$traffic_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # Only those not waited for yet: a pid reaped earlier may belong to someone else by now.
    running=$(jobs -p)
    for p in "${pids[@]}"; do
        ! grep -qx "$p" <<<"$running" || live+=("$p")
    done
    for p in "${live[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${live[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    [ -z "${covs:-}" ] || rm -rf "$covs"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nothing listens on, on any address (PREFERRED if it is free).
free_port() {
    local p=$1
    for _ in $(seq 50); do
        if ! ss -Htuan | awk '{ print $5 }' | grep -q ":$p\$" && ! grep -qx "$p" "$work/ports" 2>/dev/null; then
            echo "$p" >>"$work/ports"
            echo "$p"
            return 0
        fi
        p=$((20000 + RANDOM % 30000))
    done
    die "no free port"
}
agent_port=$(free_port 9464)
redis_port=$(free_port 6379)

ips=()
for n in $(seq 2 $((replicas + 1))); do ips+=("127.0.0.$n"); done
name="redis.fleet.livecov.test"
one_name="one.redis.fleet.livecov.test"

# --- DNS -------------------------------------------------------------------------
{
    echo "${ips[0]} $name $one_name"
    for ip in "${ips[@]:1}"; do echo "$ip $name"; done
} >"$work/hosts"
dnsmasq_user=()
[ "$(id -u)" -ne 0 ] || dnsmasq_user=(--user=root)   # root's dnsmasq would drop to a user that can't read $work
dns_port=""
for attempt in 1 2 3 4 5; do
    dns_port=$(free_port $((20000 + RANDOM % 30000)))
    # --keep-in-foreground, not --no-daemon: in --no-daemon mode dnsmasq does
    # not fork for TCP and serves one TCP client at a time, blocking UDP
    # meanwhile; $replicas A records do not fit a 512-byte UDP answer, so
    # resolvers ask again over TCP, and one that keeps its connection open
    # stalls every other query for seconds. --local: the name's AAAA query
    # gets NODATA, not REFUSED (there is no upstream server).
    dnsmasq --keep-in-foreground --port="$dns_port" --listen-address=127.0.0.1 --bind-interfaces --no-resolv --no-hosts \
        --local=/fleet.livecov.test/ --conf-file=/dev/null --log-facility=- --addn-hosts="$work/hosts" "${dnsmasq_user[@]}" \
        >/dev/null 2>"$work/dnsmasq.log" &
    dns_pid=$!
    pids+=("$dns_pid")
    sleep 0.3
    kill -0 "$dns_pid" 2>/dev/null && break
    [ "$attempt" -lt 5 ] || die "dnsmasq does not start: $(tail -3 "$work/dnsmasq.log")"
done
log "dnsmasq on 127.0.0.1:$dns_port: $name has ${#ips[@]} A records, $one_name one"

# --- the replicas --------------------------------------------------------------------
replica_pids=()
log "starting $replicas replicas of redis-server on ${ips[0]} .. ${ips[-1]} (port $redis_port), agents on port $agent_port"
for ip in "${ips[@]}"; do
    d="$work/replicas/$ip"
    mkdir -p "$d"
    "${clean_env[@]}" LD_PRELOAD="$preload" LIVECOV_DIR="$covs/$ip" LIVECOV_LISTEN="$ip:$agent_port" \
        LLVM_PROFILE_FILE="$d/exit-%p.profraw" \
        "$server" --port "$redis_port" --bind "$ip" --save '' --appendonly no --daemonize no \
        --dir "$d" --logfile "" --enable-debug-command local >"$d/log" 2>&1 </dev/null &
    pids+=("$!")
    replica_pids+=("$!")
done
# The CPU time the replicas used, ms (user + system, all threads): while
# their main threads sleep, what the agents spent answering.
clk_tck=$(getconf CLK_TCK)
replicas_cpu_ms() {
    local p sum=0 t
    for p in "${replica_pids[@]}"; do
        t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null || echo 0)
        sum=$((sum + t))
    done
    echo $((sum * 1000 / clk_tck))
}
tcp_up() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
for ip in "${ips[@]}"; do
    if ! wait_for 300 tcp_up "$ip" "$redis_port" || ! wait_for 300 tcp_up "$ip" "$agent_port"; then
        die "the replica on $ip did not start: $(tail -5 "$work/replicas/$ip/log")"
    fi
done

# --- traffic ---------------------------------------------------------------------------
# Replica i runs one of these redis-benchmark test sets, and one command of
# its own, with key space, value size, pipelining and count from i.
test_sets=(set,get incr,lpush,lpop rpush,rpop,lrange_100 sadd,spop hset,get zadd,zpopmin mset,get
    ping_inline,ping_mbulk,incr lpush,lrange_300 set,incr,sadd)
own_command() { # own_command I: the words of replica I's own command
    case $(($1 % 12)) in
        0) echo "pfadd hll:__rand_int__ a b c" ;;
        1) echo "xadd stream:__rand_int__ * field value" ;;
        2) echo "setrange sr:__rand_int__ 3 hello" ;;
        3) echo "append ap:__rand_int__ xyz" ;;
        4) echo "geoadd geo 13.361389 38.115556 m:__rand_int__" ;;
        5) echo "setbit bits:__rand_int__ 7 1" ;;
        6) echo "hincrby h:__rand_int__ f 1" ;;
        7) echo "zincrby z 1 m:__rand_int__" ;;
        8) echo "expire key:__rand_int__ 100" ;;
        9) echo "getrange key:__rand_int__ 0 3" ;;
        10) echo "sinterstore dst s:__rand_int__ s:1" ;;
        11) echo "lpos mylist __rand_int__" ;;
    esac
}
bench_client() { # bench_client IP SECONDS ARGS...: one bounded redis-benchmark run
    local ip=$1 secs=$2
    shift 2
    timeout "$secs" env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-benchmark" \
        -h "$ip" -p "$redis_port" -q "$@" >>"$work/clients.log" 2>&1
}
planned=0   # requests the first traffic asks for
traffic_for() { # traffic_for I: replica I's share of the first traffic
    local i=$1 ip=${ips[$1]} own set=${test_sets[$(($1 % ${#test_sets[@]}))]}
    read -ra own <<<"$(own_command "$i")"   # words, no globbing (xadd's `*`)
    planned=$((planned + (1000 + 97 * i) * $(tr ',' '\n' <<<"$set" | wc -l) + 300 + 31 * i + (i % 4 == 0 ? 100 + 10 * i : 0)))
    bench_client "$ip" 60 -n $((1000 + 97 * i)) -c 4 -P $((1 + i % 8)) -r $((100 + 50 * i)) -d $((3 + 7 * (i % 16))) \
        -t "$set" || log "redis-benchmark on $ip failed or timed out (clients.log)"
    bench_client "$ip" 60 -n $((300 + 31 * i)) -c 2 -r $((50 + 20 * i)) "${own[@]}" ||
        log "redis-benchmark (${own[0]}) on $ip failed or timed out (clients.log)"
    if [ $((i % 4)) -eq 0 ]; then   # a Lua script on a quarter of them (the interpreter is instrumented too)
        bench_client "$ip" 60 -n $((100 + 10 * i)) -c 2 -r 100 eval "return redis.call('incr', KEYS[1])" 1 ev:__rand_int__ ||
            log "redis-benchmark (eval) on $ip failed or timed out (clients.log)"
    fi
}
log "traffic: redis-benchmark, different commands and counts on each replica"
s=$(now_ns)
for i in "${!ips[@]}"; do traffic_for "$i"; done
traffic_ms=$(( ($(now_ns) - s) / 1000000 ))
total_requests=$(grep -o '[0-9.]* requests per second' "$work/clients.log" | wc -l)
log "traffic took $traffic_ms ms ($total_requests redis-benchmark tests, $planned requests)"

# --- the modes: the exact merge where this livecov has it, and the LCOV merge ---------------------
# The exact merge goes first: its cold collect is every agent's very first
# dump. Its flags: the default where there is --lcov-merge (which asks for
# the LCOV merge), --exact in the first versions that had it.
declare -A flags_of=([exact]="" [lcov]="")
modes=()
collect_help=$("$livecov" collect --help)
sidecar_help=$("$livecov" sidecar --help)
if grep -q -- '--lcov-merge' <<<"$collect_help" && grep -q -- '--lcov-merge' <<<"$sidecar_help"; then
    modes=(exact lcov)
    flags_of[lcov]=--lcov-merge
elif grep -q -- '--exact' <<<"$collect_help" && grep -q -- '--exact' <<<"$sidecar_help"; then
    modes=(exact lcov)
    flags_of[exact]=--exact
else
    modes=(lcov)
fi
mode_flags() { echo "${flags_of[$1]}"; }
log "merge modes measured: ${modes[*]} (flags: exact '${flags_of[exact]}', lcov '${flags_of[lcov]}')"

# --- the sidecars (no --poll-interval: each GET /coverage asks every replica) ---------------------
declare -A sidecar_pid sidecar_addr
for mode in "${modes[@]}"; do
    # shellcheck disable=SC2046
    "$livecov" sidecar $(mode_flags "$mode") --replicas "dns:$name:$agent_port" --dns-server "127.0.0.1:$dns_port" \
        --listen 127.0.0.1:0 >"$work/sidecar-$mode.out" 2>"$work/sidecar-$mode.err" </dev/null &
    sidecar_pid[$mode]=$!
    pids+=("$!")
done
for mode in "${modes[@]}"; do
    wait_for 300 grep -q '^listening on http://' "$work/sidecar-$mode.out" ||
        die "the sidecar ($mode) did not start: $(tail -5 "$work/sidecar-$mode.err")"
    sidecar_addr[$mode]=$(sed -n 's|^listening on http://||p' "$work/sidecar-$mode.out" | head -1)
done

# --- helpers ---------------------------------------------------------------------------------
ms_between() { echo $((($2 - $1) / 1000)) | awk '{ printf "%.1f\n", $1 / 1000 }'; }
# collect MODE RUN DNSNAME WANT: one `livecov collect` into $work/collect/MODE-RUN
# (a fresh folder); appends wall ms to $work/t_MODE_KIND and peak RSS KiB to
# $work/m_MODE_KIND (KIND: RUN up to its first -); checks that every replica answered.
collect() {
    local mode=$1 run=$2 dnsname=$3 want=$4 out="$work/collect/$1-$2" s e got
    local set="${mode}_${run%%-*}"
    rm -rf "$out"
    s=$(now_ns)
    # shellcheck disable=SC2046
    if ! /usr/bin/time -f %M -o "$work/rss" "$livecov" collect $(mode_flags "$mode") --replicas "dns:$dnsname:$agent_port" \
        --dns-server "127.0.0.1:$dns_port" --timeout 60 -o "$out" >"$work/collect-$mode-$run.log" 2>&1; then
        die "livecov collect ($mode, $run) failed: $(tail -5 "$work/collect-$mode-$run.log")"
    fi
    e=$(now_ns)
    ms_between "$s" "$e" >>"$work/t_$set"
    tail -1 "$work/rss" >>"$work/m_$set"
    jq -r .duration_ms "$out/manifest.json" >>"$work/d_$set"
    got=$(jq -r .instances "$out/manifest.json")
    [ "$got" = "$want" ] || die "collect ($mode, $run): $got instances of $want replicas"
}
# fetch_profraws DIR IP...: every IP's GET /coverage?format=profraw, 16 at once.
fetch_profraws() {
    local dir=$1
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    printf '%s\n' "$@" | xargs -P 16 -I{} curl -sf --max-time 60 -o "$dir/{}.profraw" \
        "http://{}:$agent_port/coverage?format=profraw" || die "GET /coverage?format=profraw failed on some replica"
}
# peer NAME DIR OUT: llvm-profdata merge + llvm-cov export over DIR/*.profraw;
# wall ms (without the fetch) to $work/t_NAME, peak RSS (the max of the two) to $work/m_NAME.
peer() {
    local set=$1 dir=$2 out=$3 s e a b
    s=$(now_ns)
    /usr/bin/time -f %M -o "$work/rss" "$profdata" merge -sparse "$dir"/*.profraw -o "$work/peer.profdata" ||
        die "llvm-profdata merge failed"
    a=$(tail -1 "$work/rss")
    /usr/bin/time -f %M -o "$work/rss" "$llvm_cov" export -format=lcov "$server" -instr-profile "$work/peer.profdata" >"$out" ||
        die "llvm-cov export failed"
    b=$(tail -1 "$work/rss")
    e=$(now_ns)
    ms_between "$s" "$e" >>"$work/t_$set"
    echo $((a > b ? a : b)) >>"$work/m_$set"
}
# peer_full NAME OUT IP...: the fetch (ms to $work/f_NAME), then the merge and the export.
peer_full() {
    local set=$1 out=$2 s
    shift 2
    s=$(now_ns)
    fetch_profraws "$work/profraw/$set" "$@"
    ms_between "$s" "$(now_ns)" >>"$work/f_$set"
    peer "$set" "$work/profraw/$set" "$out"
}
differing() { # differing A B: lines of diff between two LCOV files
    (diff "$1" "$2" || true) | grep -c '^[<>]' || true
}

# --- the same moment: every replica held still ------------------------------------------------------
log "holding every replica still (DEBUG SLEEP $freeze_s) for the collects and the raw profiles"
sleepers=()
for ip in "${ips[@]}"; do
    timeout $((freeze_s + 30)) env LLVM_PROFILE_FILE="$clients_profile" "$work/bin/redis-cli" -h "$ip" -p "$redis_port" \
        debug sleep "$freeze_s" >>"$work/sleep.log" 2>&1 &
    sleepers+=("$!")
    pids+=("$!")
done
freeze_start=$(now_ns)
sleep 1   # every DEBUG SLEEP is read and running; checked below by the raw profiles before and after

for mode in "${modes[@]}"; do
    log "cold collect of $replicas, $mode (the agents' first dump of that kind)"
    c=$(replicas_cpu_ms)
    collect "$mode" cold "$name" "$replicas"
    echo $(($(replicas_cpu_ms) - c)) >"$work/c_${mode}_cold"
done
log "raw profiles of every replica (the oracle's input)"
c=$(replicas_cpu_ms)
s=$(now_ns); fetch_profraws "$work/profraw/before" "${ips[@]}"; ms_between "$s" "$(now_ns)" >>"$work/t_fetch48"
echo $(($(replicas_cpu_ms) - c)) >"$work/c_fetch48"
s=$(now_ns); fetch_profraws "$work/profraw/one" "${ips[0]}"; ms_between "$s" "$(now_ns)" >>"$work/t_fetch1"
for mode in "${modes[@]}"; do
    log "the sidecar's GET /coverage, $mode (same moment)"
    curl -sf --max-time 120 -o "$work/out/sidecar-$mode-still.lcov" "http://${sidecar_addr[$mode]}/coverage" ||
        die "the sidecar's ($mode) GET /coverage failed"
done
log "$runs warm collects of $replicas and of 1 in each mode, interleaved"
for r in $(seq "$runs"); do
    for mode in "${modes[@]}"; do
        c=$(replicas_cpu_ms)
        collect "$mode" "warm-$r" "$name" "$replicas"
        echo $(($(replicas_cpu_ms) - c)) >>"$work/c_${mode}_warm"
        collect "$mode" "one-$r" "$one_name" 1
    done
done
fetch_profraws "$work/profraw/after" "${ips[@]}"
still_ms=$(( ($(now_ns) - freeze_start) / 1000000 ))
still=yes
for ip in "${ips[@]}"; do
    cmp -s "$work/profraw/before/$ip.profraw" "$work/profraw/after/$ip.profraw" || { still=no; break; }
done
[ "$still" = yes ] || log "the raw profiles changed during the collects ($still_ms ms; DEBUG SLEEP $freeze_s s): the reports are not of one moment (raise BENCH_FLEET_FREEZE)"
log "collects done in $still_ms ms; waiting for the replicas to wake up"
for p in "${sleepers[@]}"; do wait "$p" 2>/dev/null || true; done

log "the peer: llvm-profdata merge + llvm-cov export over the same raw profiles ($runs runs each, $replicas and 1)"
for _ in $(seq "$runs"); do
    peer peer48 "$work/profraw/before" "$work/out/oracle.lcov"
    peer peer1 "$work/profraw/one" "$work/out/oracle-one.lcov"
done

# --- the sidecars under traffic ------------------------------------------------------------------------
log "the sidecars under traffic: $requests GET /coverage each (modes interleaved) while every replica takes redis-benchmark traffic"
rm -f "$work/traffic.stop"
(
    for _ in $(seq 200); do
        for i in "${!ips[@]}"; do
            [ ! -e "$work/traffic.stop" ] || exit 0
            bench_client "${ips[$i]}" 10 -n 300 -c 2 -P 4 -r 1000 -t "${test_sets[$((i % ${#test_sets[@]}))]}" || true
        done
    done
) &
traffic_pid=$!
pids+=("$traffic_pid")
sleep 1
for mode in "${modes[@]}"; do   # warm-up
    curl -sf --max-time 120 -o /dev/null "http://${sidecar_addr[$mode]}/coverage" || die "the sidecar's ($mode) GET /coverage failed"
    : >"$work/t_sidecar_$mode"
done
for _ in $(seq "$requests"); do
    for mode in "${modes[@]}"; do
        t=$(curl -sf --max-time 120 -o "$work/out/sidecar-$mode-live.lcov" -w '%{time_total}' "http://${sidecar_addr[$mode]}/coverage") ||
            die "the sidecar's ($mode) GET /coverage failed"
        [ -s "$work/out/sidecar-$mode-live.lcov" ] || die "the sidecar's ($mode) GET /coverage was empty"
        awk -v t="$t" 'BEGIN { printf "%.1f\n", t * 1000 }' >>"$work/t_sidecar_$mode"
    done
done
declare -A sidecar_hwm sidecar_rss
for mode in "${modes[@]}"; do
    sidecar_hwm[$mode]=$(awk '/^VmHWM:/ { print $2 }' "/proc/${sidecar_pid[$mode]}/status")
    sidecar_rss[$mode]=$(awk '/^VmRSS:/ { print $2 }' "/proc/${sidecar_pid[$mode]}/status")
done
: >"$work/t_live48"; : >"$work/f_live48"; : >"$work/m_live48"
for _ in $(seq "$runs"); do peer_full live48 "$work/out/oracle-live.lcov" "${ips[@]}"; done
touch "$work/traffic.stop"
for _ in $(seq 300); do kill -0 "$traffic_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$traffic_pid" 2>/dev/null && die "the traffic loop did not stop"
wait "$traffic_pid" 2>/dev/null || true
traffic_pid=""
load_after=$(load)
log "load average after the runs: $load_after on $(nproc) CPUs"

# --- the table -------------------------------------------------------------------------------------------
med() { [ -s "$work/$1" ] && median <"$work/$1" | awk '{ printf "%.1f\n", $1 }' || echo -; }
mib() { [ "$1" = - ] && echo - || awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
fetch48=$(med t_fetch48); fetch1=$(med t_fetch1)
peer48=$(awk -v a="$fetch48" -v b="$(med t_peer48)" 'BEGIN { print a + b }')
peer1=$(awk -v a="$fetch1" -v b="$(med t_peer1)" 'BEGIN { print a + b }')
p48_m=$(med m_peer48); p1_m=$(med m_peer1)
live50=$(awk -v a="$(med f_live48)" -v b="$(med t_live48)" 'BEGIN { print a + b }')
live_m=$(med m_live48)
oracle_lines=$(wc -l <"$work/out/oracle.lcov")
# v KEY MODE: one figure of one mode ("-" when the mode was not measured).
declare -A fig
for mode in lcov exact; do
    for k in cold warm one; do fig[$k.$mode]=-; fig[m$k.$mode]=-; fig[d$k.$mode]=-; fig[c$k.$mode]=-; done
    for k in ratio diff48 diff1 side p50 p95 hwm rss bytes groups; do fig[$k.$mode]=-; done
done
for mode in "${modes[@]}"; do
    for k in cold warm one; do
        fig[$k.$mode]=$(med "t_${mode}_$k"); fig[m$k.$mode]=$(mib "$(med "m_${mode}_$k")"); fig[d$k.$mode]=$(med "d_${mode}_$k")
        fig[c$k.$mode]=$(med "c_${mode}_$k")
    done
    fig[ratio.$mode]=$(awk -v a="${fig[warm.$mode]}" -v o="${fig[one.$mode]}" 'BEGIN { printf "%.2fx", a / o }')
    fig[diff48.$mode]=$(differing "$work/out/oracle.lcov" "$work/collect/$mode-cold/merged.lcov")
    fig[diff1.$mode]=$(differing "$work/out/oracle-one.lcov" "$work/collect/$mode-one-1/merged.lcov")
    fig[side.$mode]=$(differing "$work/out/oracle.lcov" "$work/out/sidecar-$mode-still.lcov")
    fig[p50.$mode]=$(med "t_sidecar_$mode"); fig[p95.$mode]=$(p95 <"$work/t_sidecar_$mode")
    fig[hwm.$mode]=$(mib "${sidecar_hwm[$mode]}"); fig[rss.$mode]=$(mib "${sidecar_rss[$mode]}")
    fig[bytes.$mode]=$(jq '[.targets[].bytes // empty] | if length > 0 then add / length / 1024 * 10 | round / 10 else "-" end' \
        "$work/collect/$mode-warm-1/manifest.json" 2>/dev/null || echo -)
    fig[groups.$mode]=$(jq -r 'if (.groups? | type) == "array" then (.groups | length)
        elif ([.targets[]? | .group? // empty] | length) > 0 then ([.targets[] | .group // empty] | unique | length)
        else "-" end' "$work/collect/$mode-warm-1/manifest.json" 2>/dev/null || echo -)
done
d_own=$(differing "$work/out/oracle-one.lcov" "$(ls "$work"/collect/lcov-one-1/instances/*.lcov | head -1)")
best=lcov
[ "${fig[warm.exact]}" = - ] || best=exact

row() { # row WHAT KEY PEER: the LCOV merge, the exact merge, the peer, exact (else LCOV) / peer
    awk -v w="$1" -v a="${fig[$2.lcov]}" -v x="${fig[$2.exact]}" -v b="$3" -v best="$best" 'BEGIN {
        v = (best == "exact") ? x : a
        r = (b != "-" && b + 0 > 0 && v != "-") ? sprintf("%.2fx", v / b) : "-"
        printf "%-54s %12s %12s %12s %9s\n", w, a, x, b, r }'
}
ver=${redis_build%-*}
echo
echo "fleet: redis $ver (Debian's source package; clang-19 -fprofile-instr-generate -fcoverage-mapping, MALLOC=libc) x $replicas"
echo "on ${ips[0]} .. ${ips[-1]}, LD_PRELOAD liblivecov.so, agents on port $agent_port behind $name (dnsmasq);"
echo "traffic: $planned requests ($total_requests redis-benchmark tests), different on each replica; everything measured while every replica is held still (DEBUG SLEEP),"
echo "but the sidecars' p50/p95 (under traffic). $livecov_label (release); peer: curl ?format=profraw, 16 at once, +"
echo "llvm-profdata merge -sparse + llvm-cov export (LLVM 22, with the binary). Median of $runs runs; ratio: livecov ($best) / peer; load after: $load_after on $(nproc) CPUs"
printf "%-54s %12s %12s %12s %9s\n" "what" "LCOV merge" "exact merge" "peer" "ratio"
row "cold collect of $replicas, ms (first dump of that kind)" cold "$peer48"
row "warm collect of $replicas, ms" warm "$peer48"
row "collect of 1, ms" one "$peer1"
awk -v a="$peer48" -v o="$peer1" -v w="warm $replicas / one (goal: under 2x)" -v l="${fig[ratio.lcov]}" -v x="${fig[ratio.exact]}" \
    'BEGIN { printf "%-54s %12s %12s %11.2fx %9s\n", w, l, x, a / o, "-" }'
row "  the manifest's duration_ms: cold of $replicas" dcold -
row "  the manifest's duration_ms: warm of $replicas" dwarm -
row "  the manifest's duration_ms: of 1" done -
row "the $replicas agents' CPU (user + system, sum), cold, ms" ccold "$(med c_fetch48)"
row "the $replicas agents' CPU (user + system, sum), warm, ms" cwarm "$(med c_fetch48)"
row "answer per replica (manifest's bytes, mean), KiB" bytes "$(awk -v b="$(du -cb "$work"/profraw/before/*.profraw | tail -1 | cut -f1)" -v n="$replicas" 'BEGIN { printf "%.1f", b / n / 1024 }')"
row "collector peak RSS, cold collect of $replicas, MiB" mcold "$(mib "$p48_m")"
row "collector peak RSS, warm collect of $replicas, MiB" mwarm "$(mib "$p48_m")"
row "collector peak RSS, collect of 1, MiB" mone "$(mib "$p1_m")"
row "merged report of $replicas: lines differing from llvm-cov" diff48 0
row "merged report of 1: lines differing from llvm-cov" diff1 0
row "sidecar GET /coverage of $replicas: lines differing" side 0
row "sidecar GET /coverage under traffic, p50 ms" p50 "$live50"
row "sidecar GET /coverage under traffic, p95 ms" p95 -
row "sidecar peak RSS (VmHWM), MiB" hwm "$(mib "$live_m")"
row "sidecar RSS at the end (VmRSS), MiB" rss -
row "exact groups in the manifest" groups -
echo
echo "peer: of its $peer48 ms for $replicas, the fetch of the raw profiles took $fetch48 ms (the merge and export need the binary);"
echo "a replica's own LCOV (instances/*.lcov, LCOV merge): $d_own lines differing from llvm-cov over its raw profile."
echo "oracle: $oracle_lines lines, $(grep -c '^SF:' "$work/out/oracle.lcov") source files; raw profiles $(du -cb "$work"/profraw/before/*.profraw | tail -1 | cut -f1) bytes in all"
echo "same moment: $still (raw profiles before and after the collects identical; held $still_ms ms)"
awk -v n="$replicas" -v c="${fig[cold.$best]}" -v w="${fig[warm.$best]}" -v o="${fig[one.$best]}" -v m="${fig[mwarm.$best]}" \
    -v cm="${fig[mcold.$best]}" -v d="${fig[diff48.$best]}" -v s50="${fig[p50.$best]}" -v sm="${fig[hwm.$best]}" -v best="$best" \
    'function met(ok) { return ok ? "met" : "NOT met" } BEGIN {
    printf "goals (%s): exact %s; warm %d / one under 2x %s; cold under 2 s %s; collector peak RSS under 64 MiB %s;\n", best,
        met(d == 0), n, met(w / o < 2), met(c < 2000), met(m < 64 && cm < 64)
    printf "  sidecar under traffic: p50 under 2x one collect %s, peak RSS under 64 MiB %s\n", met(s50 / o < 2), met(sm < 64) }'
echo "reports: $work/collect, $work/out"
