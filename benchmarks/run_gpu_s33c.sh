#!/usr/bin/env bash
# Thirty-third session (~4 min): ncu of decode_tma at 16 tokens, 28672x8192 NVFP4, 112 / 113 / 132
# programs (clocks left alone): where do equal stream-K shares lose ~6-8 us?
set -u
. "$(dirname "$0")/gpu_steps.sh"
step time 120 python benchmarks/profile_dtma_programs.py time
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
M="sm__ctas_launched.min,sm__ctas_launched.max,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg"
M="$M,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum"
M="$M,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,smsp__cycles_active.avg,sm__warps_active.avg.pct_of_peak_sustained_active"
step ncu 300 "$NCU" --profile-from-start off --clock-control none -k regex:_decode_tma_kernel \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis --metrics "$M" python benchmarks/profile_dtma_programs.py
cat "$OUT/time.log"
grep -E "^  [_a-z]|Duration|SM Frequency|DRAM Through|Memory Through|Stall|sm__|dram__|lts__|gpu__|Block Limit|Waves|Grid Size|Registers|Shared Memory Config|Dynamic Shared" \
  "$OUT/ncu.log" | grep -vE " 0(\.0+)?$| n/a$" | head -150
cat "$OUT/summary.txt"
