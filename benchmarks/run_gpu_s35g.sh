#!/usr/bin/env bash
# Thirty-fifth session (~8 min): the default suite (the generated part of RESULTS) and issue 4's matrix on the final
# tree (8-step ring chunks for the 256-row decode tile).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step bench 200 python -m microscale.bench --out "$OUT/bench"
step matrix 370 python -m microscale.bench --suite matrix --out "$OUT/matrix"
grep -E "^\| (nvfp4|mxfp4) \| (1|16|4096)×" "$OUT/matrix.log" | cut -d'|' -f2,3,6,11 | head -24
cat "$OUT/summary.txt"
