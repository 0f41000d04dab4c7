#!/usr/bin/env bash
# Benchmarks `livecov convert` against LLVM 22's own pipeline on a real
# third-party Rust CLI from crates.io, side by side in one run, as bench.sh
# does for fixtures/large:
#
#   livecov:  livecov convert --binary BIN --profraw P... -o out.lcov
#   llvm:     llvm-profdata merge -sparse P... -o x.profdata
#             && llvm-cov export -format=lcov BIN -instr-profile x.profdata > ref.lcov
#
# The CLI is ripgrep (binary `rg`, version pinned below): a well-known program
# that is not ours, with a real dependency tree (regex, regex-automata, the
# grep-* crates, ignore, globset, serde_json, memchr, ...) of some 16
# thousand instrumented functions, whose workload is easy to make real and
# repeatable (it searches this repository's sources), and that builds with
# stable Rust. It is built as `cargo install --locked` builds it, with its own
# Cargo.lock, -C instrument-coverage and an explicit --target (so that build
# scripts and proc macros are not instrumented, as bench.sh explains), once:
# the build is kept in target/bench-convert-cli/ and skipped when the pinned
# version's binary is there. Only cargo uses the network, to fetch the crates.
#
# Two cases, each with the same binary and the same .profraw files for both
# sides, a warm file cache (one untimed warm-up run each) and nothing
# precomputed (the llvm side merges the raw profiles on every run):
# - one: one run of rg, one .profraw;
# - many: BENCH_CONVERT_CLI_RUNS (default 30) runs with different patterns
#   and flags, one .profraw each.
# Wall time is the median of BENCH_RUNS runs (default 5, the sides
# interleaved); peak RSS is /usr/bin/time's %M (the max of the two steps for
# llvm), median over the runs. Also the FN records and source files of the
# report, the profiles' size, the ratio of llvm's time to livecov's, and
# whether the LCOV outputs are byte-identical (livecov with --no-demangle, as
# llvm-cov does not demangle); a difference is reported, not fatal. Progress
# on stderr, the table (markdown) on stdout. Run by bench.sh (`make bench`);
# not part of CI.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
runs=${BENCH_RUNS:-5}
many=${BENCH_CONVERT_CLI_RUNS:-30}
crate=ripgrep
version=15.2.0
source "$root/tests/scripts/bench-common.sh"
log() { echo "bench-convert-cli: $*" >&2; }
die() { log "$*"; exit 1; }
install_tools /usr/bin/time=time
[ "$many" -ge 2 ] && [ "$many" -le 200 ] || die "BENCH_CONVERT_CLI_RUNS must be 2..200"

# --- builds --------------------------------------------------------------------
log "building livecov (release)"
"${clean_env[@]}" cargo build --release --quiet -p livecov-cli
livecov="$root/target/release/livecov"

cli_dir="$root/target/bench-convert-cli"
install_root="$cli_dir/$crate-$version"
bin="$install_root/bin/rg"
if [ -x "$bin" ]; then
    log "$crate $version already built ($bin)"
else
    log "building $crate $version from crates.io with -C instrument-coverage (its Cargo.lock; takes minutes)"
    start=$(now_ns)
    "${clean_env[@]}" RUSTFLAGS="-C instrument-coverage" \
        cargo install --locked --quiet --version "$version" "$crate" \
        --root "$install_root" --target-dir "$cli_dir/build" --target "$host"
    log "build took $(( ($(now_ns) - start) / 1000000 )) ms"
fi
[ -x "$bin" ] || die "$bin missing after the build"

# --- the workloads: rg over this repository's sources ---------------------------
work="$cli_dir/bench"
rm -rf "$work"
mkdir -p "$work/one" "$work/many" "$work/out"
# The sources to search: the checkout's tracked directories (rg skips what
# .gitignore lists, target/ among them).
dirs=(agent-rust agent-native sidecar hooks docs tests fixtures README.md)
n=0
rg_run() { # rg_run DIR ARGS...: one run of rg into its own .profraw in DIR
    n=$((n + 1))
    (cd "$root" && "${clean_env[@]}" -u RIPGREP_CONFIG_PATH LLVM_PROFILE_FILE="$1/run-$(printf %03d $n).profraw" \
        "$bin" --no-config "${@:2}" >/dev/null 2>&1) || true   # 1: no match, 2: an error; both are workload
}

log "workload: one run"
rg_run "$work/one" -n --stats -e 'fn \w+\(' -e 'TODO|FIXME' "${dirs[@]}"

log "workload: $many runs"
patterns=('fn \w+\(' 'profraw|profdata' '\bllvm[-_]\w+' '^use [a-z_]+::' 'unsafe \{' '"[^"]{20,}"' 'Result<\(\), \w+>' 'TODO')
flags=("-n" "-i -c" "-w -l" "--json" "-F -C2" "-t rust --stats" "-o -N --sort path" "-v -c --hidden" "-U --multiline-dotall -l" "--files-without-match -t markdown")
i=0
for _ in $(seq "$many"); do
    p=${patterns[$((i % ${#patterns[@]}))]}
    f=${flags[$((i % ${#flags[@]}))]}
    # shellcheck disable=SC2086 # the flags are words
    rg_run "$work/many" $f -e "$p" "${dirs[@]}"
    i=$((i + 1))
done
rg_run "$work/many" -e '(' "${dirs[@]}"         # an invalid regex: the error path
rg_run "$work/many" --bogus                     # a usage error
n_one=$(ls "$work/one" | wc -l)
n_many=$(ls "$work/many" | wc -l)
[ "$n_one" -eq 1 ] || die "the one-run case left $n_one .profraw files"
[ "$n_many" -ge "$many" ] || die "the many-runs case left $n_many .profraw files"
log "binary $(stat -c %s "$bin") bytes; one: $n_one .profraw; many: $n_many .profraw"

rows=()
bench_case() { # bench_case NAME: times both sides on $work/NAME/*.profraw, adds a row
    local name=$1 out="$work/out/$1" t_lc t_nd t_ll m_lc m_ll bytes fns files differing same
    profraws=("$work/$name"/*.profraw)
    bytes=$(du -cb "${profraws[@]}" | tail -1 | cut -f1)
    log "$name: ${#profraws[@]} .profraw files, $bytes bytes; a warm-up, then $runs timed runs of each, interleaved"
    time_convert "$out-" "$work/$name-"
    t_lc=$(median <"$work/$name-t_livecov")
    t_nd=$(median <"$work/$name-t_nodem")
    t_ll=$(median <"$work/$name-t_llvm")
    m_lc=$(median <"$work/$name-m_livecov")
    m_ll=$(median <"$work/$name-m_llvm")
    fns=$(grep -c '^FN:' "$out-ref.lcov" || true)
    files=$(grep -c '^SF:' "$out-ref.lcov" || true)
    if cmp -s "$out-ref.lcov" "$out-nodemangle.lcov"; then
        same=yes
    else
        differing=$( (diff "$out-ref.lcov" "$out-nodemangle.lcov" || true) | grep -c '^[<>]' || true)
        same="no ($differing lines differ)"
        log "$name: outputs differ: diff $out-ref.lcov $out-nodemangle.lcov"
    fi
    rows+=("$(awk -v name="$name" -v np="${#profraws[@]}" -v bytes="$bytes" -v fns="$fns" -v files="$files" \
        -v lc="$t_lc" -v nd="$t_nd" -v ll="$t_ll" -v mlc="$m_lc" -v mll="$m_ll" -v same="$same" \
        'BEGIN { printf "| %s | %d | %.1f | %d | %d | %.1f | %.1f | %.1f | %.2fx | %.1f | %.1f | %s |", name, np, bytes / 1024, fns, files, lc / 1000, nd / 1000, ll / 1000, ll / lc, mlc / 1024, mll / 1024, same }')")
}
bench_case one
bench_case many

echo
echo "$crate $version (\`rg\`, $(stat -c %s "$bin") bytes, built with -C instrument-coverage): livecov convert vs llvm-profdata merge -sparse + llvm-cov export -format=lcov (LLVM 22); median of $runs runs"
# convert's heap takes huge pages where the kernel gives them (docs/convert.md).
echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown); GLIBC_TUNABLES=${GLIBC_TUNABLES:-}"
echo
echo "| case | .profraw files | profiles KiB | FN records | source files | livecov ms | livecov --no-demangle ms | llvm ms | llvm/livecov | livecov peak RSS MiB | llvm peak RSS MiB | identical (--no-demangle) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
printf '%s\n' "${rows[@]}"
