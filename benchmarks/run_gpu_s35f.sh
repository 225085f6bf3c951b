#!/usr/bin/env bash
# Thirty-fifth session (~6 min): decode_tma's 256-row tile with 8-step ring chunks in 2 stages (_dt_ring): GPU
# tests of the 256-row tile, routing and graphs, then an A/B against 4-step chunks in 3 stages at 8 / 16 / 32 tokens
# (recorded in s35/f with the variant "dtma _DT_BIG_CHUNK=4", which the switch _DT_BIG_CHUNK_MAX_TOK=0 replaced).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_decode_tma.py -k "gpu and (256 or routing or graph or nvfp4-True)" -p no:cacheprovider
tail -3 "$OUT/tests.log"
M=8,16,32 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma _DT_BIG_CHUNK_MAX_TOK=0" step ab 200 python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672
M=16 FMTS=mxfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma _DT_BIG_CHUNK_MAX_TOK=0" step ab_mx 80 python benchmarks/exp_ws_knobs.py 28672x8192
grep -A20 "^Median" "$OUT/ab.log"; grep -A8 "^Median" "$OUT/ab_mx.log"
cat "$OUT/summary.txt"
