#!/usr/bin/env bash
# Thirty-fifth session (~4 min): ncu of prefill_ws at 128 tokens (block_t 128) against 4096 tokens (block_t 256)
# on 8192x8192 NVFP4, clocks left alone: what holds a 128-token step at ~1.8x the decode + MMA model?
set -u
. "$(dirname "$0")/gpu_steps.sh"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats --section LaunchStats"
M="sm__cycles_active.avg,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_bytes.sum,dram__bytes_read.sum"
PROFILE_N=8192 PROFILE_M=128 PROFILE_RUNS=ws,cublas step ncu128 200 "$NCU" --profile-from-start off --clock-control none $S --metrics "$M" python benchmarks/profile_prefill.py
PROFILE_N=8192 PROFILE_M=4096 PROFILE_RUNS=ws step ncu4096 200 "$NCU" --profile-from-start off --clock-control none $S --metrics "$M" python benchmarks/profile_prefill.py
for f in ncu128 ncu4096; do
  echo "=== $f"
  grep -E "^  [_a-zA-Z]|Duration|SM Frequency|Throughput|Issue|Stall|Warp Cycles|Pipe|sm__|smsp__|l1tex__|lts__|gpu__|dram__|Executed Ipc|Registers|Grid Size" "$OUT/$f.log" | grep -vE " 0(\.0+)?$| n/a$" | head -90
done
cat "$OUT/summary.txt"
