#!/usr/bin/env bash
# Measures the native agent (liblivecov, agent-native) as users build it,
# `cargo build -p livecov-native --profile release-native`, and prints a table:
#
# 1. Size: liblivecov.so and liblivecov.a in bytes, and the functions the
#    .so exports.
# 2. Start: the time the ELF constructor takes before main under LD_PRELOAD
#    (LIVECOV_VERBOSE=1 makes it print `livecov: started <instance> in N us`;
#    goal: under 1 ms), and an explicit livecov_start() with a socket and a
#    TCP listener (fixtures/native/api_test.c prints `start_us N`), over
#    BENCH_NATIVE_RUNS runs (default 50): min, median, p95, max.
# 3. Wall time of a whole short process (`app fib 1`, fixtures/native/app.c
#    built with clang-19 and coverage): plain, with liblivecov.so preloaded
#    but not asked for anything, and preloaded with LIVECOV_DIR (start, then
#    the final report computed and written at exit); median of the runs.
# 4. Fork: how long a forked child waits before it runs (its agent starts
#    in it before fork() returns there), and a whole fork (the child's
#    start, its final report at _exit, the parent's wait), in a program
#    with 0 and with 1,000 descriptors open (fixtures/native/fork_timing.c),
#    without livecov and with LD_PRELOAD + LIVECOV_DIR; BENCH_NATIVE_FORKS
#    forks each (default 100).
# 5. A pre-fork master never dumped: nginx from Debian's source package
#    (clang-19 coverage, tests/scripts/deps-nginx.sh; fixtures/nginx's
#    configuration, two workers), 3 s after its start, without livecov and
#    with LD_PRELOAD + LIVECOV_DIR: the master's anonymous resident memory
#    (RssAnon) and the CPU time of its agent's threads (their schedstat),
#    BENCH_NATIVE_MASTERS starts each (default 3), median. Its agent makes
#    no records for children that never reported (docs/agent.md).
#
# Run from anywhere, or at the end of `make bench`; not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_NATIVE_RUNS:-50}
forks=${BENCH_NATIVE_FORKS:-100}
masters=${BENCH_NATIVE_MASTERS:-3}
source "$root/tests/scripts/bench-common.sh"
for tool in clang-19; do
    command -v "$tool" >/dev/null || { echo "bench-native: $tool missing (run tests/scripts/install-deps.sh)" >&2; exit 1; }
done

# --- builds --------------------------------------------------------------------
echo "bench-native: building liblivecov (cargo build -p livecov-native --profile release-native)"
"${clean_env[@]}" cargo build --quiet -p livecov-native --profile release-native
lib="$root/target/release-native"
work="$root/target/bench-native"
rm -rf "$work"
mkdir -p "$work"
src="$root/fixtures/native"
cov_flags=(-O0 -g -fprofile-instr-generate -fcoverage-mapping)
clang-19 "${cov_flags[@]}" -I "$src" "$src/app.c" "$src/work.c" -o "$work/app" -ldl
clang-19 "${cov_flags[@]}" "$src/fork_timing.c" -o "$work/fork_timing"
clang-19 "${cov_flags[@]}" -I "$root/agent-native/include" "$src/api_test.c" -o "$work/api_test" \
    "$lib/liblivecov.a" -lgcc_s -lutil -lrt -lpthread -lm -ldl

# --- helpers ---------------------------------------------------------------------
stats() { # stats < values: min median p95 max
    sort -n | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "nan nan nan nan"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        i = int(0.95 * NR); if (i < 0.95 * NR) i++
        print v[1], m, v[i], v[NR] }'
}
# run_app LABEL [ENV=VALUE...]: `app fib 1` once; appends its wall time (us)
# to $work/wall-LABEL, and the constructor's start time, if printed, to
# $work/ctor.
run_app() {
    local label=$1 s e
    shift
    rm -rf "$work/cov"
    s=$(now_ns)
    "${clean_env[@]}" -u LD_PRELOAD "$@" LLVM_PROFILE_FILE="$work/exit.profraw" "$work/app" fib 1 >/dev/null 2>"$work/stderr"
    e=$(now_ns)
    echo $(((e - s) / 1000)) >>"$work/wall-$label"
    sed -n 's/^livecov: started .* in \([0-9]*\) us$/\1/p' "$work/stderr" >>"$work/ctor"
}

# --- runs ------------------------------------------------------------------------
echo "bench-native: $runs runs of each"
: >"$work/ctor"; : >"$work/api"
for _ in $(seq "$runs"); do
    run_app plain
    run_app idle LD_PRELOAD="$lib/liblivecov.so"
    run_app started LD_PRELOAD="$lib/liblivecov.so" LIVECOV_DIR="$work/cov" LIVECOV_VERBOSE=1
    "${clean_env[@]}" -u LD_PRELOAD LLVM_PROFILE_FILE="$work/api.profraw" "$work/api_test" "$work" |
        sed -n 's/^start_us //p' >>"$work/api"
done
[ "$(wc -l <"$work/ctor")" -eq "$runs" ] || { echo "bench-native: the constructor did not report every start" >&2; exit 1; }
echo "bench-native: $forks forks of each"
# fork_runs LABEL DESCRIPTORS [ENV=VALUE...]: fork_timing's times to
# $work/child-LABEL and $work/fork-LABEL (us).
fork_runs() {
    local label=$1 descriptors=$2
    shift 2
    rm -rf "$work/cov"
    (ulimit -n 4096 && "${clean_env[@]}" -u LD_PRELOAD "$@" LLVM_PROFILE_FILE=/dev/null \
        "$work/fork_timing" "$forks" "$descriptors" >"$work/forks" 2>"$work/stderr") ||
        { echo "bench-native: fork_timing failed ($label):" >&2; cat "$work/stderr" >&2; exit 1; }
    sed -n 's/^child_us //p' "$work/forks" >"$work/child-$label"
    sed -n 's/^fork_us //p' "$work/forks" >"$work/fork-$label"
}
for descriptors in 0 1000; do
    fork_runs "plain-$descriptors" "$descriptors"
    fork_runs "agent-$descriptors" "$descriptors" LD_PRELOAD="$lib/liblivecov.so" LIVECOV_DIR="$work/cov"
done

# master_runs LABEL [ENV=VALUE...]: nginx started $masters times; the
# master's RssAnon (KiB) to $work/master-rss-LABEL, its agent threads' CPU
# time (us) to $work/master-cpu-LABEL.
"$root/tests/scripts/deps-nginx.sh"
nginx="$root/target/nginx/current/src/objs/nginx"
master_runs() {
    local label=$1 site="$work/nginx" port pid
    shift
    : >"$work/master-rss-$label"; : >"$work/master-cpu-$label"
    for _ in $(seq "$masters"); do
        rm -rf "$site" "$work/nginx-cov"
        mkdir -p "$site/logs" "$site/html"
        chmod 755 "$site" "$site/html"
        port=$(free_port)
        # The workers drop root for nobody, as in the tests; not root, they
        # run as the user (nginx needs no `user` line then).
        sed -e "s|@DIR@|$site|g" -e "s|@GROUP@|$(id -gn nobody)|" -e "s|@PORT@|$port|" \
            "$root/fixtures/nginx/nginx.conf" >"$site/nginx.conf"
        [ "$(id -u)" -eq 0 ] || sed -i '/^user /d' "$site/nginx.conf"
        "${clean_env[@]}" -u LD_PRELOAD "$@" LLVM_PROFILE_FILE=/dev/null \
            "$nginx" -p "$site/" -c "$site/nginx.conf" -e "$site/logs/error.log" </dev/null >/dev/null 2>"$work/stderr" &
        pid=$!
        sleep 3
        kill -0 "$pid" 2>/dev/null || { echo "bench-native: nginx ended ($label):" >&2; cat "$work/stderr" "$site/logs/error.log" >&2; exit 1; }
        awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" >>"$work/master-rss-$label"
        echo $(($(run_ns "$pid" livecov) / 1000)) >>"$work/master-cpu-$label"
        kill -QUIT "$pid"
        wait "$pid" || true
    done
}
echo "bench-native: $masters starts of an nginx master of each"
master_runs plain
master_runs agent LD_PRELOAD="$lib/liblivecov.so" LIVECOV_DIR="$work/nginx-cov"

# --- table -----------------------------------------------------------------------
so_bytes=$(stat -c %s "$lib/liblivecov.so")
a_bytes=$(stat -c %s "$lib/liblivecov.a")
exports=$("$llvm_bin/llvm-nm" -D --defined-only "$lib/liblivecov.so" | awk '{ print $3 }' | grep -c '^livecov_' || true)
others=$("$llvm_bin/llvm-nm" -D --defined-only "$lib/liblivecov.so" | awk '{ print $3 }' | grep -vc '^livecov_' || true)
echo
echo "liblivecov, profile release-native ($(rustc --version | cut -d' ' -f2), load $(load))"
printf "%-52s %14s %10s\n" "file" "bytes" "MiB"
awk -v b="$so_bytes" -v e="$exports" -v o="$others" \
    'BEGIN { printf "%-52s %14d %10.2f\n", "liblivecov.so (" e " livecov_* exported, " o " other)", b, b / 1048576 }'
awk -v b="$a_bytes" 'BEGIN { printf "%-52s %14d %10.2f\n", "liblivecov.a", b, b / 1048576 }'
echo
printf "%-52s %8s %8s %8s %8s\n" "start, us ($runs runs)" "min" "median" "p95" "max"
row() { # row LABEL FILE [SCALE]
    read -r mn md p9 mx < <(stats <"$2")
    awk -v l="$1" -v a="$mn" -v b="$md" -v c="$p9" -v d="$mx" -v k="${3:-1}" \
        'BEGIN { printf "%-52s %8.0f %8.0f %8.0f %8.0f\n", l, a / k, b / k, c / k, d / k }'
}
row "ELF constructor under LD_PRELOAD (goal < 1000)" "$work/ctor"
row "livecov_start() with socket and TCP (api_test)" "$work/api"
echo
printf "%-52s %8s %8s %8s %8s\n" "wall time of \`app fib 1\`, ms" "min" "median" "p95" "max"
for label in plain idle started; do
    case $label in
        plain) text="no livecov" ;;
        idle) text="LD_PRELOAD=liblivecov.so, no LIVECOV_DIR" ;;
        started) text="LD_PRELOAD + LIVECOV_DIR (final report at exit)" ;;
    esac
    read -r mn md p9 mx < <(stats <"$work/wall-$label")
    awk -v l="$text" -v a="$mn" -v b="$md" -v c="$p9" -v d="$mx" \
        'BEGIN { printf "%-52s %8.2f %8.2f %8.2f %8.2f\n", l, a / 1000, b / 1000, c / 1000, d / 1000 }'
done
echo
printf "%-52s %8s %8s %8s %8s\n" "fork ($forks forks), us" "min" "median" "p95" "max"
for descriptors in 0 1000; do
    for label in plain agent; do
        case $label in
            plain) text="no livecov" ;;
            agent) text="LD_PRELOAD + LIVECOV_DIR" ;;
        esac
        row "child runs after: $text, $descriptors open" "$work/child-$label-$descriptors"
        row "whole fork: $text, $descriptors open" "$work/fork-$label-$descriptors"
    done
done
echo
printf "%-52s %8s %8s %8s %8s\n" "nginx master, never dumped, 3 s after start ($masters)" "min" "median" "p95" "max"
row "RssAnon, KiB: no livecov" "$work/master-rss-plain"
row "RssAnon, KiB: LD_PRELOAD + LIVECOV_DIR" "$work/master-rss-agent"
row "agent threads' CPU, us: LD_PRELOAD + LIVECOV_DIR" "$work/master-cpu-agent"
ctor_median=$(stats <"$work/ctor" | cut -d' ' -f2)
awk -v m="$ctor_median" 'BEGIN { printf "constructor start: median %.0f us (goal: under 1000 us): %s\n", m, (m < 1000 ? "met" : "NOT met") }'
