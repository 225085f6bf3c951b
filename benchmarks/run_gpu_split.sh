#!/usr/bin/env bash
# Third device call of the eleventh session: prefill_ws with the tail tiles split in K
# (`split_tail`, replacing the stream-K ranges of run_gpu_sk*.sh): GPU tests, then CUDA-graph
# timings with (p=sk) and without (p=1) the split at 128 / 256 / 512 tokens per token tile and
# at 4096 tokens with the wrapper's tile, on the issue's three weight shapes.
#   bash benchmarks/run_gpu_split.sh            (on the GPU machine, repo root; ~4 min)
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
if [ "${SUITE:-0}" = 1 ]; then
  step bench 200 python -m microscale.bench --out "$OUT/bench"
  shapes=""
  for m in 128 512 4096; do for nk in 8192x8192 28672x8192 8192x28672; do shapes="$shapes${shapes:+,}${m}x$nk"; done; done
  step bench_e2m1 260 python -m microscale.bench --suite linear --formats nvfp4,mxfp4 --shapes "$shapes" \
    --out "$OUT/bench_e2m1"
  cat "$OUT/summary.txt"
  tail -n 2 "$OUT/bench.log" "$OUT/bench_e2m1.log"
  exit 0
fi
step pytest_ws 150 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
step ws_graph 240 env WS=1 WS_GRAPH=1 WS_M=128,256,512 WS_CFGS=256x4,128x6,64x8 WS_PERSIST=sk,1 \
  python benchmarks/run_gpu_prefill.py
cp "$OUT/prefill_ws.json" "$OUT/prefill_ws_small.json" 2>/dev/null
step ws_4096 120 env WS=1 WS_GRAPH=1 WS_M=4096 WS_CFGS=auto WS_PERSIST=sk,1 python benchmarks/run_gpu_prefill.py
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error|checks" "$OUT"/pytest_ws.log "$OUT"/ws_graph.log | head -4
grep -h -E "^(nvfp4|mxfp4) .* ws " "$OUT"/ws_graph.log "$OUT"/ws_4096.log | sed -e 's/ = /=/' -e 's/ (.*TFLOP\/s)//' \
  -e 's/ ws bt=/ /' -e 's/ms.linear/lin/' | cut -c1-90
# Afterwards (a separate call: SUITE=1), the default suite and the suite's E2M1 linear cases at
# 128 / 512 / 4096 tokens on the three weight shapes, with the split as the default.
