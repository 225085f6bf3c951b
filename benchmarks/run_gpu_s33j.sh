#!/usr/bin/env bash
# Thirty-third session (~2.5 min): _DT_ONE_TABLE on by default with 256-row tiles at 64 token columns and at
# 16-32 where K >= 2 N: decode_tma as routed against the switch off, 8-64 tokens, 8192-row weights; then the
# E2M1 decode_tma GPU tests with the new default.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step onetable 80 env M=8,16,32,64 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma -_DT_ONE_TABLE" \
  python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672
step tests 90 python -m pytest -q tests/kernels/test_decode_tma.py -k \
  "(test_gpu_decode_tma and (nvfp4-True or mxfp4-True)) or test_gpu_routing_and_graph or test_gpu_graphs_make"
grep -v "^ *clocks" "$OUT/onetable.log" | tail -n 19
tail -n 3 "$OUT/tests.log"
cat "$OUT/summary.txt"
