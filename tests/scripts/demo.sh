#!/usr/bin/env bash
# The main job on one machine, as it runs in a cluster:
# - three replicas of a Rust service built with coverage and the livecov
#   agent, on 127.0.0.2, 127.0.0.3 and 127.0.0.4 sharing one coverage port,
#   behind one DNS name served by a real DNS server (dnsmasq on a loopback
#   port), as a headless Service is in Kubernetes;
# - a Node service with the livecov hook (NODE_OPTIONS=--require), in a
#   coverage directory of its own, as another container would be;
# - `livecov sidecar` as the aggregator: it resolves the name, asks every
#   replica, collects the Node process over its directory, and merges.
# The demo drives traffic, fetches the merged LCOV from the aggregator,
# prints a per-file table, and writes an HTML report when genhtml is
# installed. Every process it starts is ended on exit, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
work="$root/target/demo"
name="service.demo.livecov.test"
token="demo-token"
ips=(127.0.0.2 127.0.0.3 127.0.0.4)

pids=()
cleanup() {
    local p
    # Also the children not yet in the list: an interrupt can land between
    # a `&` and the `started $!` after it.
    pids+=($(pgrep -P $$ || true))
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    pids=()
    [ -z "${covs:-}" ] || rm -rf "$covs"
}
trap cleanup EXIT
trap 'echo "demo: interrupted, stopping everything it started" >&2; exit 130' INT TERM

# started PID: remembers a process to end (also in $work/pids, for whoever
# wants to check that nothing is left behind).
started() { pids+=("$1"); echo "$1" >>"$work/pids"; }

# wait_for WHAT CMD...: polls CMD every 0.1 s for at most 30 s.
wait_for() {
    local what=$1
    shift
    for _ in $(seq 300); do
        "$@" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "demo: $what did not happen within 30 s" >&2
    return 1
}

# free_port: a port no TCP or UDP socket of this machine uses now.
free_port() {
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 30000))
        ss -Htuan | awk '{ print $5 }' | grep -q ":$p\$" || { echo "$p"; return; }
    done
    echo "demo: no free port" >&2
    return 1
}

rm -rf "$work" && mkdir -p "$work"
# The coverage directories hold Unix sockets, whose paths may not be longer
# than 107 bytes: a short folder of their own, whatever the checkout's path.
covs=$(mktemp -d "${TMPDIR:-/tmp}/livecov-demo.XXXXXX")
host=$(rustc -vV | sed -n 's/^host: //p')
clean_env=(env -u RUSTC_WRAPPER -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET -u RUSTFLAGS)

echo "==> building livecov and fixtures/service (-C instrument-coverage, with the agent)"
"${clean_env[@]}" cargo build --quiet -p livecov-cli
livecov="$root/target/debug/livecov"
(
    cd fixtures/service
    "${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$root/target/fixtures/service" \
        cargo build --quiet --target "$host"
)
service="$root/target/fixtures/service/$host/debug/service"

agent_port=$(free_port)
# dnsmasq on a free port; another one if something took it meanwhile.
dnsmasq_user=()
[ "$(id -u)" -ne 0 ] || dnsmasq_user=(--user=root)  # root's dnsmasq would drop to a user that can't read $work
printf '%s '"$name"'\n' "${ips[@]}" >"$work/hosts"
for attempt in 1 2 3 4 5; do
    dns_port=$(free_port)
    dnsmasq --no-daemon --port="$dns_port" --listen-address=127.0.0.1 --bind-interfaces --no-resolv --no-hosts \
        --conf-file=/dev/null --log-facility=- --addn-hosts="$work/hosts" "${dnsmasq_user[@]}" \
        >/dev/null 2>"$work/dnsmasq.log" &
    dns_pid=$!
    started "$dns_pid"
    sleep 0.3
    kill -0 "$dns_pid" 2>/dev/null && break
    [ "$attempt" -lt 5 ] || { echo "demo: dnsmasq does not start: $(cat "$work/dnsmasq.log")" >&2; exit 1; }
done
echo "==> DNS: dnsmasq on 127.0.0.1:$dns_port answers $name with ${ips[*]}"

echo "==> three replicas, the agent of each on <ip>:$agent_port (bearer token on TCP)"
for ip in "${ips[@]}"; do
    d="$work/replica-$ip"
    mkdir -p "$d"
    LIVECOV_DIR="$covs/$ip" LIVECOV_LISTEN="$ip:$agent_port" LIVECOV_TOKEN="$token" \
        LLVM_PROFILE_FILE="$d/exit-%p.profraw" "$service" --addr "$ip:0" >"$d/out" 2>"$d/err" </dev/null &
    started $!
done
agent_up() { ls "$covs/$1"/sockets/*.sock >/dev/null 2>&1; }
for ip in "${ips[@]}"; do
    if ! wait_for "the replica on $ip starting" grep -q '^listening on ' "$work/replica-$ip/out" ||
        ! wait_for "the agent of the replica on $ip starting" agent_up "$ip"; then
        echo "demo: its stderr: $(tail -3 "$work/replica-$ip/err")" >&2
        exit 1
    fi
done

echo "==> a Node service with the hook: NODE_OPTIONS=--require hooks/node/livecov-hook.cjs"
mkdir -p "$work/node"
LIVECOV_DIR="$covs/node" NODE_OPTIONS="--require $root/hooks/node/livecov-hook.cjs" \
    node fixtures/node/http/server.js >"$work/node/out" 2>"$work/node/err" </dev/null &
started $!
wait_for "the Node service starting" grep -q '^listening on ' "$work/node/out"

echo "==> livecov sidecar as the aggregator: --replicas dns:$name:$agent_port --dir $covs/node"
"$livecov" sidecar --replicas "dns:$name:$agent_port" --dns-server "127.0.0.1:$dns_port" --dir "$covs/node" \
    --target-token "$token" --listen 127.0.0.1:0 --poll-interval 1 --resolve-interval 2 \
    >"$work/sidecar.out" 2>"$work/sidecar.err" </dev/null &
started $!
wait_for "the sidecar listening" grep -q '^listening on http://' "$work/sidecar.out"
aggregator=$(sed -n 's|^listening on http://||p' "$work/sidecar.out" | head -1)

echo "==> traffic: each replica serves different endpoints"
port_of() { sed -n 's/^listening on .*://p' "$work/replica-$1/out"; }
curl -sf "http://${ips[0]}:$(port_of "${ips[0]}")/hello?name=demo" >/dev/null
curl -sf "http://${ips[1]}:$(port_of "${ips[1]}")/fib?n=25" >/dev/null
curl -sf "http://${ips[2]}:$(port_of "${ips[2]}")/primes?limit=100" >/dev/null
node_addr=$(sed -n 's/^listening on //p' "$work/node/out")
curl -sf "http://$node_addr/hello?name=demo" >/dev/null
curl -sf "http://$node_addr/items?n=2" >/dev/null

echo "==> merged coverage: curl http://$aggregator/coverage"
all_answered() {
    curl -sf "http://$aggregator/targets" >"$work/targets.json" &&
        [ "$(grep -o '"state":"running"' "$work/targets.json" | wc -l)" -ge $((${#ips[@]} + 1)) ]
}
wait_for "every replica answering the aggregator" all_answered
curl -sf "http://$aggregator/coverage" >"$work/merged.lcov"
echo
awk -v root="$root/" '
    BEGIN { printf "%-44s %6s %6s %8s\n", "file", "lines", "hit", "cover" }
    /^SF:/ { file = substr($0, 4); sub(root, "", file) }
    /^LF:/ { lf = substr($0, 4) }
    /^LH:/ { lh = substr($0, 4) }
    /^end_of_record/ {
        printf "%-44s %6d %6d %7.1f%%\n", file, lf, lh, lf ? 100 * lh / lf : 0
        tf += lf; th += lh
    }
    END { printf "%-44s %6d %6d %7.1f%%\n", "total", tf, th, tf ? 100 * th / tf : 0 }
' "$work/merged.lcov"
echo
echo "targets of the aggregator: curl http://$aggregator/targets"
echo "merged LCOV: $work/merged.lcov"
if command -v genhtml >/dev/null; then
    genhtml -q -o "$work/html" "$work/merged.lcov" && echo "HTML report: $work/html/index.html"
fi
