#!/usr/bin/env bash
# One device call: the kernel tests on CUDA tensors, every GPU correctness check, the
# quantize/dequantize timings and dequantize tile sweep, then the default benchmark suite.
#   bash benchmarks/run_gpu_all.sh            (on the GPU machine, repo root)
# Logs under $OUT (or ./gpu_out); a short summary is printed last. Each step has its own
# time limit so one slow step cannot eat the others' time.
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step pytest 300 python -m pytest -q tests/kernels --ignore=tests/kernels/test_quantize_kernels.py
step pytest_quantize 240 python -m pytest -q tests/kernels/test_quantize_kernels.py
step quantize 300 env SWEEP=0 python benchmarks/run_gpu_quantize.py
step deq_sweep 120 env DEQ_SWEEP=1 python benchmarks/run_gpu_quantize.py
step gemv 200 python benchmarks/run_gpu_gemv.py --quick
step gemv_mma 300 python benchmarks/run_gpu_gemv_mma.py
step prefill 150 env QUICK=1 python benchmarks/run_gpu_prefill.py
step models 120 python benchmarks/run_gpu_models.py
step bench 200 python -m microscale.bench --out "$OUT/bench"
echo "--- summary"
cat "$OUT/summary.txt"
grep -h -E "correctness:|checks (all ok|FAILED)|FAIL|dequantize checks| passed| failed" "$OUT"/*.log | head -20
tail -n 1 "$OUT/bench.log"
