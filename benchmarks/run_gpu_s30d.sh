#!/usr/bin/env bash
# Thirtieth session, fourth call (~8 min): issue 4's matrix (M 1..4096 on the three shapes, NVFP4 / MXFP4, and the
# 8-bit one-token rows) and the default suite on this tree (per-warp slot release, multiply-add scales).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step matrix 300 python -m microscale.bench --suite matrix --out "$OUT/matrix"
step bench 170 python -m microscale.bench --out "$OUT/bench"
grep -E "^\| (nvfp4|mxfp4) \| (1|16|4096)×" "$OUT/matrix.log" | cut -d'|' -f2,3,6,11 | head -24
cat "$OUT/summary.txt"
