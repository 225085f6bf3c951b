#!/usr/bin/env bash
# Issue 4's benchmark in one call (~7 min on an H200): the `matrix` suite (NVFP4 / MXFP4 at M
# 1-4096 on 8192x8192, 28672x8192, 8192x28672; MXFP8 / int8 at M=1) against cuBLAS bf16.
# If ./exp_tree holds an untracked copy of an experiment branch, its exp_dtma_variants.py runs
# first from there.      bash benchmarks/run_gpu_matrix.sh
set -u
. "$(dirname "$0")/gpu_steps.sh"
if [ -d exp_tree ]; then
  (cd exp_tree && PYTHONPATH="$PWD" step variants 150 python benchmarks/exp_dtma_variants.py 28672x8192 8192x28672)
  grep -A30 "^shape" "$OUT/variants.log"
fi
step matrix 470 python -m microscale.bench --suite matrix --out "$OUT/matrix" --time-budget 420
tail -3 "$OUT/matrix.log"
cat "$OUT/summary.txt"
