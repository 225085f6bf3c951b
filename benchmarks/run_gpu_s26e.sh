#!/usr/bin/env bash
# Twenty-sixth session, last call (~2 min): decode_tma for MXFP8 (E4M3 codes, 16 words a step,
# 2 ring chunks, up to 32 tokens; MICROSCALE_DECODE_TMA_8BIT=1 turns it on). GPU tests, then
# 4-32 tokens against cuBLAS bf16, the GEMV and the Triton prefill kernel (the previous routes).
set -u
. "$(dirname "$0")/gpu_steps.sh"
export MICROSCALE_DECODE_TMA_8BIT=1
step tests 150 python -m pytest -q tests/kernels/test_decode_tma.py -k "gpu and mxfp8"
tail -n 3 "$OUT/tests.log"
M=4,16,32 ROUNDS=1 FMTS=mxfp8_e4m3 VARIANTS="linear;dtma;gemv;prefill" \
  step tdec8 150 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
tail -n 30 "$OUT/tdec8.log"
cat "$OUT/summary.txt"
