#!/usr/bin/env bash
# Twenty-seventh session, fourth call (~4 min): decode_tma on 4-bit integers with one block per K
# step scales the fp32 MMA result (MICROSCALE_DT_POST_SCALE). GPU tests of decode_tma (both ways),
# then 3-32 tokens of int4_affine_g128: decode_tma, decode_tma with per-pair scaling.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 150 python -m pytest -q tests/kernels/test_decode_tma.py -k "gpu_decode_tma and int4"
tail -n 3 "$OUT/tests.log"
M=3,8,16,32 ROUNDS=1 FMTS=int4_affine_g128 VARIANTS="dtma post;dtma nopost" \
  step post 120 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
sed -n '/^Median/,$p' "$OUT/post.log"
cat "$OUT/summary.txt"
