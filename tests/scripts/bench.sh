#!/usr/bin/env bash
# Benchmarks `livecov convert` against LLVM 22's own pipeline on a large
# instrumented Rust program (fixtures/large), side by side in one run:
#
#   livecov:  livecov convert --binary BIN --profraw P... -o out.lcov
#   llvm:     llvm-profdata merge -sparse P... -o x.profdata
#             && llvm-cov export -format=lcov BIN -instr-profile x.profdata > ref.lcov
#
# Both get the same binary and the same .profraw files, a warm file cache (one
# untimed warm-up run each) and nothing precomputed: the llvm side merges the
# raw profiles on every run, as livecov does. Wall time is the median of
# BENCH_RUNS runs (default 5, the two sides interleaved); peak RSS is
# /usr/bin/time's %M (the max of the two steps for llvm), median over the runs.
# Then says whether the LCOV outputs are byte-identical (livecov with
# --no-demangle, as llvm-cov does not demangle); a difference is reported,
# not fatal. Then runs tests/scripts/bench-convert-cli.sh (the same
# comparison on ripgrep from crates.io, with one and with many raw profiles),
# bench-agent.sh (the in-process agent's dumps against the same LLVM tools,
# its memory, and a service's throughput under dumps), bench-sidecar.sh, bench-native.sh (liblivecov's size and
# start time), bench-node.sh and bench-python.sh (the hooks' cost to an
# app's throughput), bench-fleet.sh (48 redis replicas collected),
# bench-busy.sh (live dumps of a busy redis) and bench-rust-busy.sh (live
# dumps of two busy Rust programs with the Rust agent). Run from anywhere as
# `make bench`; not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-5}

# --- tools -------------------------------------------------------------------
source "$root/tests/scripts/bench-common.sh"
install_tools /usr/bin/time=time

# --- builds ------------------------------------------------------------------
echo "bench: building livecov (release)"
"${clean_env[@]}" cargo build --release --quiet -p livecov-cli
livecov="$root/target/release/livecov"

# With an explicit --target, RUSTFLAGS reach only the program and its
# libraries, not the build scripts and proc macros: those would run
# instrumented during the build and leave .profraw files in their sources.
echo "bench: building fixtures/large with -C instrument-coverage"
fixture_target="$root/target/fixtures/large"
start=$(date +%s%N)
"${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$fixture_target" \
    cargo build --quiet --locked --target "$host" --manifest-path fixtures/large/Cargo.toml
echo "bench: fixture build took $(( ($(date +%s%N) - start) / 1000000 )) ms (incremental if it was built before)"
bin="$fixture_target/$host/debug/large"

# --- the workload: a few deterministic runs, one .profraw each ----------------
work="$fixture_target/bench"
rm -rf "$work"
mkdir -p "$work/profraw" "$work/out"
inputs="$root/fixtures/large/inputs"
n=0
workload() { # workload ARGS...: one run of the fixture into its own .profraw
    n=$((n + 1))
    "${clean_env[@]}" LLVM_PROFILE_FILE="$work/profraw/run-$(printf %02d $n).profraw" \
        "$bin" "$@" >/dev/null 2>&1
}
workload analyze --rules "$inputs/rules.toml" --events "$inputs/events.json" --log "$inputs/access.log" --format text
workload generate --seed 99 --count 400 --source gen -o "$work/out/gen.json"
workload analyze --rules "$inputs/rules.toml" --events "$inputs/events.json" --events "$work/out/gen.json" --format toml --rounds 3
workload analyze --rules "$inputs/rules.toml" --events "$work/out/gen.json" --format pretty --rounds 2
workload grep -i -e 'api/v1/users/\d+' -e ' 50[023] ' --count --words "$inputs/access.log"
workload grep -e '"(GET|POST) ' -r '[REQ]' -v "$inputs/access.log"
workload transform "$inputs/config.json" --merge "$inputs/overrides.json" --rename '_(\w)=-$1' --flatten --format pretty
workload transform "$inputs/config.json" --pointer /limits --format toml
workload transform "$inputs/config.json" --format text
workload grep -e '(' "$inputs/access.log" || true   # an invalid regex: the error path
workload --bogus || true                             # a clap usage error
profraws=("$work"/profraw/*.profraw)
echo "bench: ${#profraws[@]} .profraw files, $(du -cb "${profraws[@]}" | tail -1 | cut -f1) bytes; binary $(stat -c %s "$bin") bytes"

echo "bench: a warm-up, then $runs timed runs of each, interleaved"
time_convert "$work/out/" "$work/"

t_llvm=$(median <"$work/t_llvm")
row() { # row LABEL TIMES RSS
    local t m
    t=$(median <"$2")
    m=$(median <"$3")
    awk -v label="$1" -v t="$t" -v m="$m" -v ref="$t_llvm" \
        'BEGIN { printf "%-48s %10.1f %14.1f %8.2fx\n", label, t / 1000, m / 1024, ref / t }'
}
echo
echo "fixtures/large: $(grep -c '^FN:' "$work/out/ref.lcov") FN records, $(grep -c '^SF:' "$work/out/ref.lcov") source files; ${#profraws[@]} .profraw files; median of $runs runs"
printf "%-48s %10s %14s %9s\n" "tool" "wall ms" "peak RSS MiB" "speedup"
row "livecov convert" "$work/t_livecov" "$work/m_livecov"
row "livecov convert --no-demangle" "$work/t_nodem" "$work/m_nodem"
row "llvm-profdata merge + llvm-cov export (LLVM 22)" "$work/t_llvm" "$work/m_llvm"
echo

differing=$( (diff "$work/out/ref.lcov" "$work/out/nodemangle.lcov" || true) | grep -c '^[<>]' || true)
if [ "$differing" -eq 0 ] && cmp -s "$work/out/ref.lcov" "$work/out/nodemangle.lcov"; then
    echo "identical: yes"
else
    echo "identical: no ($differing differing lines; diff $work/out/ref.lcov $work/out/nodemangle.lcov)"
fi

echo
"$root/tests/scripts/bench-convert-cli.sh"

# --- the in-process agent ------------------------------------------------------
echo
"$root/tests/scripts/bench-agent.sh"
"$root/tests/scripts/bench-sidecar.sh"
"$root/tests/scripts/bench-native.sh"
"$root/tests/scripts/bench-node.sh"
"$root/tests/scripts/bench-python.sh"
"$root/tests/scripts/bench-go.sh"
"$root/tests/scripts/bench-fleet.sh"
"$root/tests/scripts/bench-busy.sh"
"$root/tests/scripts/bench-rust-busy.sh"
