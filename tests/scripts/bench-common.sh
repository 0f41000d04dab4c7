# Sourced by the bench scripts: the host triple, LLVM 22's tools from the
# rustup llvm-tools component, and `clean_env`, an `env` prefix that drops
# what the caller (an outer cargo, make, a shell profile) set that would
# change a build: target dir, wrappers, flags, profile file names, and the
# agent's own settings. Also the small helpers the scripts share, and
# install_tools for the tools each needs.
host=$(rustc -vV | sed -n 's/^host: //p')
llvm_bin="$(rustc --print sysroot)/lib/rustlib/$host/bin"
profdata="$llvm_bin/llvm-profdata"
llvm_cov="$llvm_bin/llvm-cov"
for t in "$profdata" "$llvm_cov"; do
    [ -x "$t" ] || { echo "$(basename "$0"): $t missing (run tests/scripts/install-deps.sh)" >&2; exit 1; }
done

clean_env=(env)
while IFS= read -r name; do
    case "$name" in
        CARGO_HOME) ;;
        CARGO*|__CARGO*|RUSTC|RUSTC_WRAPPER|RUSTC_WORKSPACE_WRAPPER|RUSTDOC|RUSTDOCFLAGS|RUSTFLAGS|RUSTC_BOOTSTRAP|LLVM_PROFILE_FILE|LIVECOV_*)
            clean_env+=(-u "$name") ;;
    esac
done < <(compgen -e)

# install_tools COMMAND=PACKAGE...: installs with apt-get the Debian
# packages of the commands (names or absolute paths) that are missing, so
# that each benchmark also runs alone on a fresh machine; fails naming what
# could not be installed.
install_tools() {
    local me missing=() t sudo=""
    me=$(basename "$0" .sh)
    for t in "$@"; do
        command -v "${t%%=*}" >/dev/null || missing+=("${t#*=}")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    echo "$me: installing ${missing[*]}" >&2
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
        { echo "$me: could not install ${missing[*]} (apt-get install failed)" >&2; exit 1; }
    for t in "$@"; do
        command -v "${t%%=*}" >/dev/null || { echo "$me: ${t%%=*} is missing and could not be installed" >&2; exit 1; }
    done
}

# Cargo flags of a fixture build with its dependencies (the Rust agent
# among them) optimized, as docs/agent.md tells users to build a program
# that links the agent.
optimized_dependencies=(--config 'profile.dev.package."*".opt-level = 3')

# service_copy TO: fixtures/service built with -C instrument-coverage
# where the tests build it (target/fixtures/service, same flags, under the
# lock they take there), copied to TO: the tests rebuild it in place when
# the agent changes, and the agent reads the coverage mapping from the
# running executable's file.
service_copy() {
    local target="$root/target/fixtures/service"
    mkdir -p "$target"
    (cd "$root/fixtures/service" && flock "$target/.lock" "${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" \
        CARGO_TARGET_DIR="$target" cargo build --quiet --target "$host")
    flock "$target/.lock" cp "$target/$host/debug/service" "$1"
}

# median, p95 < numbers, one a line ("nan" for none).
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
p95() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit } i = int(0.95 * NR); if (i < 0.95 * NR) i++; print v[i] }'; }
now_ns() { date +%s%N; }
# run_ns PID [PREFIX]: time its threads (those whose name starts with
# PREFIX) have run on a CPU so far, in ns (schedstat).
run_ns() {
    local t sum=0 ns
    for t in /proc/"$1"/task/*; do
        if [ -z "${2:-}" ] || [[ "$(cat "$t/comm" 2>/dev/null)" == "$2"* ]]; then
            ns=$(cut -d' ' -f1 "$t/schedstat" 2>/dev/null) && sum=$((sum + ns))
        fi
    done
    echo "$sum"
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
# wait_for COUNT CMD...: polls CMD every 0.1 s, at most COUNT times.
# free_port: a TCP port nothing on this machine listens on or uses, below
# the kernel's range of ephemeral ports: a benchmark's clients open
# thousands of connections, and one took a port picked in that range
# before the server bound it.
free_port() {
    local low span port
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    span=$((low > 11000 ? low - 10000 : 1000))
    port=$((10000 + RANDOM % span))
    while ss -Htan | awk '{ print $4 }' | grep -q ":$port\$"; do port=$((10000 + RANDOM % span)); done
    echo "$port"
}
wait_for() {
    local n=$1
    shift
    for _ in $(seq "$n"); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}
# sleep_ms MS: sleeps MS milliseconds.
sleep_ms() { sleep "$(awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }')"; }

# --- curl's floor (bench-busy.sh, bench-rust-busy.sh) -------------------------
# serve_file SOCKET FILE: a trivial HTTP server on a Unix socket that
# answers every request with FILE's bytes in one write, into a send buffer
# as large as the agent asks for; its pid in $floor_pid. Fetched by curl
# under the same load as a dump, a report of that size from it takes the
# least time a dump can: the rest of a dump's time is the agent's.
serve_file() {
    python3 - "$1" "$2" <<'EOF' &
import socket, sys
path, body = sys.argv[1], open(sys.argv[2], "rb").read()
answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(body) + body
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen(16)
while True:
    client, _ = server.accept()
    with client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        client.settimeout(10)
        try:
            client.recv(65536)
            client.sendall(answer)
        except OSError:
            pass
EOF
    floor_pid=$!
    wait_for 50 test -S "$1" || { echo "$(basename "$0"): the trivial server did not start" >&2; exit 1; }
}
# fetch_ms SOCKET OUT [FIRST] [REPORT]: GET /coverage on SOCKET into OUT;
# curl's time_total in ms on stdout (its time to the first byte appended
# to the file FIRST, and the agent's own time to make the report, from its
# Server-Timing header, to the file REPORT). A failed request is an error,
# not a time.
fetch_ms() {
    local times
    times=$(curl -sS --fail --max-time 30 --unix-socket "$1" -o "$2" \
        -w '%{time_total} %{time_starttransfer} %header{server-timing}\n' localhost/coverage) ||
        { echo "$(basename "$0"): GET /coverage on $1 failed" >&2; return 1; }
    awk -v first="${3:-}" -v report="${4:-}" '{
            printf "%.3f\n", $1 * 1000
            if (first != "") printf "%.3f\n", $2 * 1000 >>first
            if (report != "" && split($3, dur, "dur=") == 2) printf "%.3f\n", dur[2] >>report
        }' <<<"$times"
}

# floor_times SOCKET COUNT GAP_MS [FIRST]: COUNT fetches from serve_file's
# server, GAP_MS apart, as dumps are; each as fetch_ms.
floor_times() {
    for _ in $(seq "$2"); do
        sleep_ms "$3"
        fetch_ms "$1" /dev/null "${4:-}"
    done
}

# --- livecov convert against LLVM's own pipeline (bench.sh, bench-convert-cli.sh)
# These use the caller's $livecov, $bin, $profraws (an array), $work and
# $runs, with $profdata and $llvm_cov from above.
run_livecov() { # run_livecov OUT [--no-demangle]
    "$livecov" convert --binary "$bin" --profraw "${profraws[@]}" -o "$1" "${@:2}"
}
run_llvm() { # run_llvm OUT
    "$profdata" merge -sparse "${profraws[@]}" -o "$work/x.profdata" &&
        "$llvm_cov" export -format=lcov "$bin" -instr-profile "$work/x.profdata" >"$1"
}
rss_livecov() { # peak RSS in KiB
    /usr/bin/time -f %M -o "$work/rss" "$livecov" convert --binary "$bin" --profraw "${profraws[@]}" -o "$1" "${@:2}"
    tail -1 "$work/rss"
}
rss_llvm() { # the max of the two steps, KiB
    local a b
    /usr/bin/time -f %M -o "$work/rss" "$profdata" merge -sparse "${profraws[@]}" -o "$work/x.profdata"
    a=$(tail -1 "$work/rss")
    /usr/bin/time -f %M -o "$work/rss" "$llvm_cov" export -format=lcov "$bin" -instr-profile "$work/x.profdata" >"$1"
    b=$(tail -1 "$work/rss")
    echo $((a > b ? a : b))
}
# time_convert OUT TIMES: an untimed warm-up (which pages in the binary, the
# profiles and the tools), then $runs interleaved runs of livecov, livecov
# --no-demangle and llvm, into OUTlivecov.lcov, OUTnodemangle.lcov and
# OUTref.lcov; each run's wall µs into TIMESt_{livecov,nodem,llvm}, then in
# runs of their own under /usr/bin/time the peak KiB into TIMESm_{...}.
time_convert() {
    local out=$1 times=$2 s e t
    run_livecov "${out}livecov.lcov"
    run_livecov "${out}nodemangle.lcov" --no-demangle
    run_llvm "${out}ref.lcov"
    for t in t_livecov t_nodem t_llvm m_livecov m_nodem m_llvm; do : >"$times$t"; done
    for _ in $(seq "$runs"); do
        s=$(now_ns); run_livecov "${out}livecov.lcov"; e=$(now_ns)
        echo $(((e - s) / 1000)) >>"${times}t_livecov"
        s=$(now_ns); run_livecov "${out}nodemangle.lcov" --no-demangle; e=$(now_ns)
        echo $(((e - s) / 1000)) >>"${times}t_nodem"
        s=$(now_ns); run_llvm "${out}ref.lcov"; e=$(now_ns)
        echo $(((e - s) / 1000)) >>"${times}t_llvm"
        rss_livecov "${out}livecov.lcov" >>"${times}m_livecov"
        rss_livecov "${out}nodemangle.lcov" --no-demangle >>"${times}m_nodem"
        rss_llvm "${out}ref.lcov" >>"${times}m_llvm"
    done
}

# sources_of REV NAME: the sources to build and measure. With a commit REV,
# its files (from `git archive`, in target/NAME-rev, kept) and a target
# folder of their own; else the checkout's. Sets src, build_dir and
# rev_label (the commit, "+ uncommitted changes" when the checkout has some).
sources_of() {
    local rev=$1 name=$2 sha
    if [ -n "$rev" ]; then
        sha=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") || { echo "$name: $rev is not a commit" >&2; exit 1; }
        src="$root/target/$name-rev/src-$sha"
        if [ ! -f "$src/Cargo.toml" ]; then
            rm -rf "$src.tmp"
            mkdir -p "$src.tmp"
            git -C "$root" archive "$sha" | tar -x -C "$src.tmp"
            mv "$src.tmp" "$src"
        fi
        build_dir="$root/target/$name-rev/target"
        rev_label=${sha:0:7}
    else
        src="$root"
        build_dir="$root/target"
        rev_label=$(git -C "$root" log -1 --format=%h 2>/dev/null || echo '?')
        [ -z "$(git -C "$root" status --porcelain --untracked-files=no -- agent-rust agent-native sidecar 2>/dev/null)" ] ||
            rev_label="$rev_label + uncommitted changes"
    fi
}
