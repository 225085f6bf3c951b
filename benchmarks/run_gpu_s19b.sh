#!/usr/bin/env bash
# Nineteenth session: issue 4's matrix with every row (ours and cuBLAS's) timed as CUDA-graph
# replays (the matrix suite's new default, --graph always).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step matrix 570 python -m microscale.bench --suite matrix --out "$OUT/matrix" --time-budget 520
tail -3 "$OUT/matrix.log"
cat "$OUT/summary.txt"
