#!/usr/bin/env bash
# Twenty-ninth session, first call (~9 min): fp16 activations on the Gluon kernels (prefill_ws,
# decode_tma). The new GPU tests against float64 for every format; fp16 timings at 16 and 4096 tokens,
# ms.linear as routed now against the Triton prefill kernel (the route fp16 took before) and cuBLAS
# fp16; a few bf16 GPU tests of the same kernels (their signature changed).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests_f16 200 python -m pytest -q -x tests/kernels/test_gluon_f16.py -k gpu
step t_fp16 270 env DTYPE=fp16 M=16,4096 FMTS=nvfp4,mxfp4,int4_affine_g128,int8_fp16,mxfp8_e4m3 ROUNDS=1 \
  VARIANTS="linear;prefill" python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
step tests_bf16 100 python -m pytest -q tests/kernels/test_prefill_gluon.py tests/kernels/test_decode_tma.py \
  -k "gpu_prefill_ws and (nvfp4 or int8_fp16) and None or gpu_decode_tma and (nvfp4 or int4_affine_g128)"
tail -n 3 "$OUT/tests_f16.log"
tail -n 25 "$OUT/t_fp16.log"
tail -n 3 "$OUT/tests_bf16.log"
cat "$OUT/summary.txt"
