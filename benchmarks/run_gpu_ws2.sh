#!/usr/bin/env bash
# One device call for the persistent, two-steps-per-iteration prefill_ws (tenth session): its
# GPU tests, persistent vs one program per tile at 512 / 4096 tokens (short timings), and the
# suite's E2M1 linear cases at 128 / 512 / 4096 tokens on the issue's three weight shapes.
#   bash benchmarks/run_gpu_ws2.sh            (on the GPU machine, repo root; ~4 min)
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step pytest_ws 150 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
step ws 200 env WS=1 WS_M=512,4096 WS_CFGS=256x4 WS_PERSIST=1,0 python benchmarks/run_gpu_prefill.py
shapes=""
for m in 128 512 4096; do for nk in 8192x8192 28672x8192 8192x28672; do shapes="$shapes${shapes:+,}${m}x$nk"; done; done
step bench_e2m1 240 python -m microscale.bench --suite linear --formats nvfp4,mxfp4 --shapes "$shapes" --out "$OUT/bench_e2m1"
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error|checks" "$OUT"/pytest_ws.log "$OUT"/ws.log | head
tail -n 10 "$OUT/ws.log"
tail -n 1 "$OUT/bench_e2m1.log"
