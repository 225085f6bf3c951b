#!/usr/bin/env bash
# Twenty-sixth session, last call (~3 min): decode_tma for MXFP8 (E4M3 codes, 16 words a step,
# 2 ring chunks, up to 32 tokens). GPU tests, then 1-32 tokens against cuBLAS bf16, the GEMV and
# the Triton prefill kernel (the previous routes).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q tests/kernels/test_decode_tma.py -k "gpu and (mxfp8 or routing or eager or tables)"
tail -n 3 "$OUT/tests.log"
M=1,2,4,8,16,32 ROUNDS=1 FMTS=mxfp8_e4m3 VARIANTS="linear;dtma;gemv;prefill" \
  step tdec8 200 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
tail -n 40 "$OUT/tdec8.log"
cat "$OUT/summary.txt"
