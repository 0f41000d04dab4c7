#!/usr/bin/env bash
# Seeds corpus/lcov_merge with reports that have every kind of line the
# merge reads, in the layout of fuzz_targets/lcov_merge.rs (two reports
# split at a NUL byte): llvm-cov's and lcov's function lines (FN with and
# without an end line, FNL/FNA), checksums, branches never taken ("-"),
# two tests, a file twice.
#
# Then: cargo +nightly fuzz run lcov_merge -- -max_total_time=60
set -euo pipefail

corpus="$(cd "$(dirname "$0")" && pwd)/corpus/lcov_merge"
mkdir -p "$corpus"
llvm='SF:/src/a.c
FN:3,main
FN:9,helper
FNDA:1,main
FNDA:0,helper
FNF:2
FNH:1
BRDA:4,0,0,1
BRDA:4,0,1,0
BRDA:10,0,0,-
BRDA:10,0,1,-
BRF:4
BRH:1
DA:3,1
DA:4,1
DA:5,0
DA:9,0
DA:10,0
LF:5
LH:2
end_of_record
'
lcov2='TN:unit
SF:/src/a.c
FNL:0,3,7
FNA:0,2,main
FNL:1,9
FNA:1,0,helper
FNF:2
FNH:1
DA:3,2,Zm9v
DA:4,2
DA:9,0
LF:3
LH:2
end_of_record
TN:unit
SF:/src/b.h
FN:1,4,inline_one
FNDA:7,inline_one
DA:1,7
DA:2,18446744073709551615
LF:2
LH:2
end_of_record
'
printf '%s' "$llvm" > "$corpus/llvm"
printf '%s\0%s' "$llvm" "$lcov2" > "$corpus/llvm-and-lcov"
printf '%s\0%s' "$lcov2" "$lcov2" > "$corpus/twice"
printf '%s\0%s' "${llvm//$'\n'/$'\r\n'}" "" > "$corpus/crlf"
echo "seed-lcov: $(ls "$corpus" | wc -l) inputs in $corpus"
