#!/usr/bin/env bash
# Thirty-fourth session (~6 min): issue 4's matrix (M 1..4096 on the three shapes, NVFP4 / MXFP4, and the 8-bit
# one-token rows) on the final tree (first-program sums on 256-row tiles, one scale table per E2M1 weight).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step matrix 480 python -m microscale.bench --suite matrix --out "$OUT/matrix"
grep -E "^\| (nvfp4|mxfp4) \| (1|16|4096)×" "$OUT/matrix.log" | cut -d'|' -f2,3,6,11 | head -24
cat "$OUT/summary.txt"
