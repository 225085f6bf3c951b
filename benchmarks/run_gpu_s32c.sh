#!/usr/bin/env bash
# (Ran once with MICROSCALE_DT_ALIGN, an experiment since reverted: see NOTES_linear, thirty-second session.)
# Thirty-second session, call c (~5 min). In call b, equal stream-K shares still lost ~6 µs against whole
# tiles with the parts' arrivals moved to the programs' ends, so the cost is not the epilogue. Hypothesis:
# programs reading different K offsets at the same time (a share = end of tile a, start of tile a + 1) are
# slower than programs in step. _DT_ALIGN: each program takes its last tile's start first. (1) GPU tests
# with it on; (2) 112 whole 256-row tiles against 113 / 132 equal shares, aligned or not, and the default
# tiles on the 8192-row shapes (two K parts per tile), aligned or not.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 env MICROSCALE_DT_ALIGN=1 python -m pytest -q tests/kernels/test_decode_tma.py \
  -k "gpu and (fp4 or int4_affine_g128 or int8_fp16 or routing)"
step shares 240 env M=16 FMTS=nvfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma;dtma +_DT_ALIGN;dtma r256;dtma r256 p113;dtma r256 p113 +_DT_ALIGN;dtma r256 p132;dtma r256 p132 +_DT_ALIGN" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192 8192x28672
tail -n 3 "$OUT/tests.log"
grep -v "^ *clocks" "$OUT/shares.log" | tail -n 24
cat "$OUT/summary.txt"
