#!/usr/bin/env bash
# Twenty-sixth session, third call (~6 min): decode_tma for int4 weights with blocks of 32
# (int4_fp16, int4_affine_g32: two int32 scales per row and step); GPU tests of decode_tma and
# the routing, 1-16 tokens against the previous routes, then the default suite on this tree.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_linear.py -k gpu
tail -n 3 "$OUT/tests.log"
M=1,4,16 ROUNDS=1 FMTS=int4_fp16,int4_affine_g32 VARIANTS="linear;dtma;prefill" \
  step tdec32 120 python benchmarks/exp_ws_knobs.py 28672x8192
tail -n 16 "$OUT/tdec32.log"
step bench 300 python -m microscale.bench --out "$OUT/bench"
tail -n 5 "$OUT/bench.log"
cat "$OUT/summary.txt"
