#!/usr/bin/env bash
# One device call for what the ninth session built without a GPU (benchmarks/NOTES_linear.md;
# run in the tenth session, logs in h200_2026-12-01i/): the GPU tests of the fragment-ordered
# activations / select decode (gemv_mma) and of the warp-specialized Gluon prefill, then the
# 8/16-token sweep of the former and the 512/4096-token timings of the latter.
#   bash benchmarks/run_gpu_pending.sh            (on the GPU machine, repo root; ~6-8 min)
# Logs under $OUT (or ./gpu_out); a short summary is printed last. Each step has its own
# time limit so one slow or hanging step cannot eat the others' time.
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step pytest_ws 150 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
step pytest_mma 150 python -m pytest -q tests/kernels/test_gemv_mma.py -k gpu
step mma_sweep 200 env MMA_SWEEP=xf MMA_SWEEP_M=8,16 MMA_SWEEP_CHECKS=2 python benchmarks/run_gpu_gemv_mma.py
step ws 200 env WS=1 python benchmarks/run_gpu_prefill.py
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E "checks (all ok|FAILED)|FAIL| passed| failed|Error" "$OUT"/*.log | head -20
tail -n 12 "$OUT/mma_sweep.log"
tail -n 12 "$OUT/ws.log"
