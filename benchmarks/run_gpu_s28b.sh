#!/usr/bin/env bash
# Twenty-eighth session, second call (~9 min): the GPU tests of decode_tma on 8-bit integers and the
# signed post scale (blocks of 128) that the first call's -k filter left out, prefill_ws's on 8-bit
# integers, E2M1 / MXFP8 / int4 cases as a check of the shared decode; then prefill_ws against the
# Triton prefill kernel on 8-bit integers (64-4096 tokens).
set -u
. "$(dirname "$0")/gpu_steps.sh"
T=tests/kernels/test_decode_tma.py::test_gpu_decode_tma
P=tests/kernels/test_prefill_gluon.py::test_gpu_prefill_ws
step tests 300 python -m pytest -q "$T[int4_fp16@128-True]" "$T[int8_fp16@128-True]" "$T[mxint8-True]" \
  "$T[int8_fp16-True]" "$T[int8_affine_g128-True]" "$T[int8_affine_g128-False]" "$T[int8_affine_g32-True]" \
  "$T[nvfp4-True]" "$T[mxfp8_e4m3-True]" "$T[int4_affine_g128-True]" \
  "$P[True-None-mxint8]" "$P[True-None-int8_fp16]" "$P[True-None-int8_affine_g128]" "$P[False-3-int8_affine_g128]" \
  "$P[True-3-mxint8]" "$P[True-None-nvfp4]" "$P[True-None-mxfp8_e4m3]"
tail -n 5 "$OUT/tests.log"
M=64,512,4096 ROUNDS=1 FMTS=int8_fp16,int8_affine_g128,mxint8 VARIANTS="prefill;ws" \
  step ws 260 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
echo "== ws"; sed -n '/^Median/,$p' "$OUT/ws.log"
cat "$OUT/summary.txt"
