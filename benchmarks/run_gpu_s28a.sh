#!/usr/bin/env bash
# Twenty-eighth session, first call (~8 min): 8-bit integers (int8_fp16, int8_affine_g*, MXINT8) on
# the Gluon kernels. GPU tests of decode_tma / prefill_ws on them (and the signed 4/8-bit post scale,
# blocks of 128), then decode_tma against the Triton prefill kernel (4-32 tokens) and the GEMV (4).
set -u
. "$(dirname "$0")/gpu_steps.sh"
T=tests/kernels/test_decode_tma.py::test_gpu_decode_tma
step tests 270 python -m pytest -q "$T[int4_fp16@128-True]" "$T[int8_fp16@128-True]" "$T[mxint8-True]" \
  "$T[int8_fp16-True]" "$T[int8_affine_g128-True]" "$T[int8_affine_g128-False]" "$T[int8_affine_g32-True]" \
  tests/kernels/test_prefill_gluon.py -k "gpu_routing_switch and int8"
tail -n 5 "$OUT/tests.log"
M=4,16,32 ROUNDS=1 FMTS=int8_fp16,int8_affine_g128,mxint8 VARIANTS="prefill;dtma" \
  step dtma 200 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
M=4 ROUNDS=1 FMTS=int8_fp16,int8_affine_g128,mxint8 VARIANTS="gemv" \
  step gemv 60 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
for s in dtma gemv; do echo "== $s"; sed -n '/^Median/,$p' "$OUT/$s.log"; done
cat "$OUT/summary.txt"
