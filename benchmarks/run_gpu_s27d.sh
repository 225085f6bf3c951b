#!/usr/bin/env bash
# Twenty-seventh session, fourth call (~4 min): decode_tma on 4-bit integers with one block per K
# step scales the fp32 MMA result (MICROSCALE_DT_POST_SCALE). GPU tests of decode_tma on int4 (both
# ways), then int4_affine_g128 at 2-32 tokens (GEMV, decode_tma both ways) and MXFP8 at 2-3 tokens
# (GEMV, decode_tma: its route starts at 4 tokens, 2-3 were never timed).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 150 python -m pytest -q tests/kernels/test_decode_tma.py -k "gpu_decode_tma and int4"
tail -n 3 "$OUT/tests.log"
M=2,3,16,32 ROUNDS=1 FMTS=int4_affine_g128 VARIANTS="gemv;dtma post;dtma nopost" \
  step post 100 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
M=2,3 ROUNDS=1 FMTS=mxfp8_e4m3 VARIANTS="gemv;dtma" step f8 60 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
for s in post f8; do sed -n '/^Median/,$p' "$OUT/$s.log"; done
cat "$OUT/summary.txt"
