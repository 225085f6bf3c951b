#!/usr/bin/env bash
# Twenty-ninth session, second call (~9 min): bf16 GPU tests of the Gluon kernels after the fp16
# plumbing (their code path unchanged; a subset of formats), decode_tma with fp16 activations scaling
# integer weights after the MMA or per pair (16 tokens), and issue 4's token matrix with fp16
# activations (ms.linear as routed against cuBLAS fp16) for NVFP4 and int4_affine_g128.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests_bf16 220 python -m pytest -q tests/kernels/test_prefill_gluon.py tests/kernels/test_decode_tma.py \
  -k "gpu_prefill_ws and (nvfp4 or int8_fp16 or mxint4) or gpu_decode_tma and (nvfp4 or int8_fp16 or mxint4 or g32)"
step post 80 env DTYPE=fp16 M=16 FMTS=int4_affine_g128,int8_affine_g128 ROUNDS=2 VARIANTS="dtma post;dtma nopost" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
step matrix 250 env DTYPE=fp16 M=1,2,4,8,16,32,64,128,512,4096 FMTS=nvfp4,int4_affine_g128 ROUNDS=1 VARIANTS=linear \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192 8192x28672
tail -n 3 "$OUT/tests_bf16.log"
tail -n 10 "$OUT/post.log"
tail -n 92 "$OUT/matrix.log" | grep -v "^$"
cat "$OUT/summary.txt"
