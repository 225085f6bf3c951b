#!/usr/bin/env bash
# One device call after routing NVFP4 / MXFP4 prefill to prefill_ws (tenth session): its GPU
# tests, the default suite (for RESULTS.md) and the E2M1 linear cases at 128 / 512 / 4096
# tokens on the issue's three weight shapes.
#   bash benchmarks/run_gpu_ws_suite.sh            (on the GPU machine, repo root; ~5 min)
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step pytest_ws 150 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
step bench 200 python -m microscale.bench --out "$OUT/bench"
shapes=""
for m in 128 512 4096; do for nk in 8192x8192 28672x8192 8192x28672; do shapes="$shapes${shapes:+,}${m}x$nk"; done; done
step bench_e2m1 240 python -m microscale.bench --suite linear --formats nvfp4,mxfp4 --shapes "$shapes" --out "$OUT/bench_e2m1"
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error" "$OUT"/pytest_ws.log | head
tail -n 1 "$OUT/bench.log" "$OUT/bench_e2m1.log"
