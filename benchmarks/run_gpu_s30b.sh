#!/usr/bin/env bash
# Thirtieth session, second call (~8 min): per-warp slot release in decode_tma (now default) and the bf16 decodes'
# block scales by one integer multiply-add (UE4M3 for scanned weights, E8M0): bit-identity against the old paths,
# the GPU tests of both Gluon kernels, and A/B timings at 16 (decode_tma) and 4096 tokens (prefill_ws).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step bitwise 200 python benchmarks/exp_bitwise_ab.py
step t16 120 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="dtma;dtma -_DT_WARP_ARRIVE -_SCALE_IMAD;dtma -_SCALE_IMAD" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672 8192x8192
step t4096 150 env M=4096 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="ws;ws -_SCALE_IMAD" \
  python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672 28672x8192
step tests 200 python -m pytest -q -x tests/kernels/test_decode_tma.py tests/kernels/test_prefill_gluon.py -k gpu
grep -c FAIL "$OUT/bitwise.log"; tail -n 1 "$OUT/bitwise.log"
tail -n 19 "$OUT/t16.log"
tail -n 13 "$OUT/t4096.log"
tail -n 3 "$OUT/tests.log"
cat "$OUT/summary.txt"
