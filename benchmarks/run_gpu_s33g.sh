#!/usr/bin/env bash
# Thirty-third session (~5 min): the first-program sums kept for 256-row tiles only (128-row tiles compile as
# before): GPU tests of the E2M1 kinds (256-row tiles, 28672-row weights, one-table), program counts 112 /
# 113 / 132 on 28672x8192 at 16 tokens, dtma at 16 and 64 tokens on 28672x8192.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 330 python -m pytest -q tests/kernels/test_decode_tma.py -k \
  "(test_gpu_decode_tma and (256 or one or nvfp4-True or mxfp4-True)) or test_gpu_routing_and_graph or test_gpu_graphs_make"
step programs 90 python benchmarks/profile_dtma_programs.py time
step dtma 90 env M=16,64 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="dtma" python benchmarks/exp_ws_knobs.py 28672x8192
tail -n 3 "$OUT/tests.log"
cat "$OUT/programs.log"
grep -v "^ *clocks" "$OUT/dtma.log" | tail -n 7
cat "$OUT/summary.txt"
