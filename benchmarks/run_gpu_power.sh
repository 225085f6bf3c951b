#!/usr/bin/env bash
# Linear under sustained load, with nvidia-smi sampling SM clock, power and throttle reasons
# beside it (queries only; nothing is set): exp_clocks.py (time per call in ten consecutive
# windows of 1.5 s, ours against cuBLAS bf16) and exp_power.py (one-token GEMV configurations:
# burst and steady time). Sixteenth session: logs in h200_2026-12-02/s16/.
#     [TOKENS=1,16,4096] [ROUNDS=2] [SKIP="configs"] bash benchmarks/run_gpu_power.sh   (~2 min)
set -u
. "$(dirname "$0")/gpu_steps.sh"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 50 > "$OUT/smi.csv" 2>&1 &
SMI=$!
step clocks 240 python benchmarks/exp_clocks.py
step configs 300 python benchmarks/exp_power.py
kill $SMI
nvidia-smi -q -d PERFORMANCE,POWER,CLOCK > "$OUT/smi_q.txt" 2>&1
grep -v Warning "$OUT/clocks.log"
grep -v Warning "$OUT/configs.log" | tail -20
cat "$OUT/summary.txt"
