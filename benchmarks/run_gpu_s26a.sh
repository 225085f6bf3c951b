#!/usr/bin/env bash
# Twenty-sixth session, first call (~6 min): prefill_ws for 4-bit integer weights with fp16
# scales (int4_affine_g*, int4_fp16). GPU tests of the Gluon prefill (every format, split and
# whole tiles), then 4096 / 512 tokens against cuBLAS bf16 and the Triton prefill kernel (the
# previous route of these formats).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q -x tests/kernels/test_prefill_gluon.py
tail -n 5 "$OUT/tests.log"
M=4096 ROUNDS=1 FMTS=int4_affine_g128,int4_fp16,nvfp4 VARIANTS="linear;prefill" \
  step t4096 240 python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672 28672x8192
tail -n 12 "$OUT/t4096.log"
M=512 ROUNDS=1 FMTS=int4_affine_g128,int4_affine_g32 VARIANTS="linear;prefill" \
  step t512 120 python benchmarks/exp_ws_knobs.py 8192x8192 28672x8192
tail -n 8 "$OUT/t512.log"
cat "$OUT/summary.txt"
