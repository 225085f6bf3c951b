#!/usr/bin/env bash
# Issue 4's benchmark in one call (~4-5 min on an H200 before the suite waited for a free clock
# before each timing; expect ~6, not yet run so): the `matrix` suite (NVFP4 / MXFP4 at M
# 1-4096 on 8192x8192, 28672x8192, 8192x28672; MXFP8 / int8 at M=1) against cuBLAS bf16.
#     bash benchmarks/run_gpu_matrix.sh
set -u
. "$(dirname "$0")/gpu_steps.sh"
step matrix 570 python -m microscale.bench --suite matrix --out "$OUT/matrix" --time-budget 510
tail -3 "$OUT/matrix.log"
cat "$OUT/summary.txt"
