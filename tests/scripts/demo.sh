#!/usr/bin/env bash
# The demo: build a Rust program with coverage instrumentation, run it a few
# times, and let livecov turn its raw profiles into LCOV (no LLVM tool
# involved), then print a per-file summary. The live agent will take the
# place of the raw profiles once it lands.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
work="$root/target/demo"
rm -rf "$work" && mkdir -p "$work/prof"

echo "==> building livecov"
cargo build --quiet --release -p livecov-cli
livecov="$root/target/release/livecov"

echo "==> building fixtures/rust with -C instrument-coverage"
(
    cd fixtures/rust
    env -u RUSTC_WRAPPER -u CARGO_TARGET_DIR RUSTFLAGS="-C instrument-coverage" \
        CARGO_TARGET_DIR="$root/target/fixtures/rust" cargo build --quiet --offline
)
app="$root/target/fixtures/rust/debug/app"

echo "==> running it"
LLVM_PROFILE_FILE="$work/prof/%p.profraw" "$app" shapes circle:1.5 rect:2,3 >/dev/null
LLVM_PROFILE_FILE="$work/prof/%p.profraw" "$app" stats 5 3 9 -2 7 >/dev/null
LLVM_PROFILE_FILE="$work/prof/%p.profraw" "$app" words hello sky >/dev/null || true

echo "==> livecov convert"
"$livecov" convert --binary "$app" --profraw "$work"/prof/*.profraw -o "$work/coverage.lcov"

awk -v root="$root/" '
    /^SF:/ { file = substr($0, 4); sub(root, "", file) }
    /^LF:/ { lf = substr($0, 4) }
    /^LH:/ { lh = substr($0, 4) }
    /^end_of_record/ {
        printf "%-40s %6d %6d %7.1f%%\n", file, lf, lh, lf ? 100 * lh / lf : 0
        tf += lf; th += lh
    }
    BEGIN { printf "%-40s %6s %6s %8s\n", "file", "lines", "hit", "cover" }
    END { printf "%-40s %6d %6d %7.1f%%\n", "total", tf, th, tf ? 100 * th / tf : 0 }
' "$work/coverage.lcov"
echo
echo "LCOV report: $work/coverage.lcov"
command -v genhtml >/dev/null && genhtml -q -o "$work/html" "$work/coverage.lcov" && echo "HTML report: $work/html/index.html" || true
