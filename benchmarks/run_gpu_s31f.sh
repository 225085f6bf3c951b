#!/usr/bin/env bash
# Thirty-first session, sixth call (~5 min): the 256-row two-slice tile, now routed for E2M1 / bf16 / 16 token
# columns on weights of 80-100% of a wave of 256-row tiles (_dt_tile): GPU tests (both tiles, ragged, stream-K
# shares; routing and graph tests), then 256 against 128 rows at 8, 16, 32 and 64 tokens on 28672x8192 (which
# token columns to route it for), with the routed ms.linear.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q tests/kernels/test_decode_tma.py -k "gpu and (nvfp4 or mxfp4 or routing or graphs or eager)"
step tiles 240 env M=8,16,32,64 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="dtma r128;dtma r256;linear" \
  python benchmarks/exp_ws_knobs.py 28672x8192
tail -n 3 "$OUT/tests.log"
grep -E "rel err" "$OUT/tiles.log" | grep -v "e-03" | head
tail -n 26 "$OUT/tiles.log"
cat "$OUT/summary.txt"
