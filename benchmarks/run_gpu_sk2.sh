#!/usr/bin/env bash
# Second device call for stream-K in prefill_ws (eleventh session): CUDA-graph timings (the
# few-token calls are host-bound eagerly) with and without stream-K at 128 / 256 / 512 tokens for
# each token tile, on the issue's three weight shapes.
#   bash benchmarks/run_gpu_sk2.sh            (on the GPU machine, repo root; ~3 min)
# (Ran on commit 3356664, whose prefill_ws used stream-K ranges; on later commits the same
# switch, p=sk, selects the aligned K split of the tail tiles: benchmarks/run_gpu_split.sh.)
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step ws_graph 300 env WS=1 WS_GRAPH=1 WS_M=128,256,512 WS_CFGS=256x4,128x6,64x8 WS_PERSIST=sk,1 \
  python benchmarks/run_gpu_prefill.py
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E "checks" "$OUT"/ws_graph.log | head -3
grep -h -E "^(nvfp4|mxfp4) .* ws " "$OUT"/ws_graph.log | sed -e 's/ = /=/' -e 's/ (.*TFLOP\/s)//' | cut -c1-100
