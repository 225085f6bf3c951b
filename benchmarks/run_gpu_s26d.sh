#!/usr/bin/env bash
# Twenty-sixth session, fourth call (~4 min): prefill_ws for MXFP8 (E4M3 codes, E8M0 scales;
# 16-byte code loads, bit-placement decode). GPU tests of the Gluon prefill for it, then 512 and
# 4096 tokens against cuBLAS bf16 and the Triton prefill kernel (its previous route).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu and (mxfp8 or routing or small or bad)"
tail -n 3 "$OUT/tests.log"
M=4096,512 ROUNDS=1 FMTS=mxfp8_e4m3 VARIANTS="linear;prefill" \
  step tf8 200 python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672 28672x8192
tail -n 12 "$OUT/tf8.log"
cat "$OUT/summary.txt"
