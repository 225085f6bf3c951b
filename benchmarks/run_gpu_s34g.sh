#!/usr/bin/env bash
# Thirty-fourth session (~2.5 min): PREFILL_WS_SMALL_MAX_NK_BF16 = 2^25 as routed: ms.linear in graphs at 48 / 64
# tokens on 8192x8192 (now decode_tma) and 4096x8192 (still prefill_ws), and the GPU routing tests.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step route 120 env M=48,64 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="linear;dtma;ws" \
  python benchmarks/exp_ws_knobs.py 8192x8192 4096x8192
step tests 150 python -m pytest -q tests/kernels/test_prefill_gluon.py tests/kernels/test_decode_tma.py -k \
  "small_weight or test_gpu_routing_and_graph or test_gpu_eager_auto_routes or test_gpu_graphs_make"
grep -A12 "^Median" "$OUT/route.log"
tail -n 3 "$OUT/tests.log"
cat "$OUT/summary.txt"
