#!/usr/bin/env bash
# Thirty-third session (~3 min): decode_tma, 28672x8192 NVFP4, 16 tokens: times at 56 (two whole tiles in a
# row), 112, 113 and 132 programs, and ncu warp stall reasons and memory tables of 112 against 113.
set -u
. "$(dirname "$0")/gpu_steps.sh"
PROGRAMS=56,112,113,132 step time 120 python benchmarks/profile_dtma_programs.py time
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
PROGRAMS=112,113 step ncu 300 "$NCU" --profile-from-start off --clock-control none -k regex:_decode_tma_kernel \
  --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --section MemoryWorkloadAnalysis_Chart \
  --section SchedulerStats --print-details all python benchmarks/profile_dtma_programs.py
cat "$OUT/time.log"
grep -iE "^  [_a-z]|stall|Warp Cycles|Eligible|Issued|Active Warps|dram|L2|sectors|Requests" "$OUT/ncu.log" | head -160
cat "$OUT/summary.txt"
