#!/usr/bin/env bash
# Twentieth session, third device call (~5 min): the 33-64-token route to prefill_ws on small
# weights (GPU tests; routed call against decode_tma and prefill_ws on six shapes), and the
# matrix suite's 64-token rows on 8192x8192 with it.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu" tests/kernels/test_decode_tma.py
(cd benchmarks && M=48,64 FMTS=nvfp4 ROUNDS=2 VARIANTS="linear;dtma;g4 s8 t64" \
  step small 200 python exp_ws_knobs.py 1024x4096 4096x4096 14336x4096 4096x14336 8192x8192 8192x14336)
step matrix64 120 python -m microscale.bench --suite matrix --shapes 64x8192x8192 --formats nvfp4,mxfp4 \
  --out "$OUT/matrix64"
tail -5 "$OUT/tests.log"; grep -A40 "^Median" "$OUT/small.log"; grep -i "nvfp4\|mxfp4" "$OUT/matrix64.log" | tail -4
cat "$OUT/summary.txt"
