#!/usr/bin/env bash
# One device call for stream-K in prefill_ws (eleventh session): its GPU tests, then short
# timings with and without stream-K at 128 / 512 / 4096 tokens on the issue's three weight
# shapes (the wrapper's tile choice), and a token-tile sweep at 128 / 512 tokens with stream-K.
#   bash benchmarks/run_gpu_sk.sh            (on the GPU machine, repo root; ~6 min)
# (Ran on commit eb1582c, whose prefill_ws used stream-K ranges; on later commits the same
# switch, p=sk, selects the aligned K split of the tail tiles: benchmarks/run_gpu_split.sh.)
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step pytest_ws 150 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
step ws 200 env WS=1 WS_M=128,512,4096 WS_CFGS=auto WS_PERSIST=sk,1 python benchmarks/run_gpu_prefill.py
cp "$OUT/prefill_ws.json" "$OUT/prefill_ws_ab.json" 2>/dev/null
step ws_tiles 150 env WS=1 WS_M=128,512 WS_CFGS=256x4,128x6,64x8 WS_PERSIST=sk python benchmarks/run_gpu_prefill.py
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error|checks" "$OUT"/pytest_ws.log "$OUT"/ws.log | head
grep -h -E "^(nvfp4|mxfp4) .* ws " "$OUT"/ws.log "$OUT"/ws_tiles.log | sed -e 's/ = /=/' | cut -c1-110
