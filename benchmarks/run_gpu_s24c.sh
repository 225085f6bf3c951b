#!/usr/bin/env bash
# Twenty-fourth session, third call (~2 min): eager loops at 2-8 tokens on 28672x8192 (the new
# routes against gemv / gemv_mma, plans on and off), and ncu pipe utilization of decode_tma with
# 8 and 16 token columns (clocks left alone).
set -u
. "$(dirname "$0")/gpu_steps.sh"
MS=2,4,8 SHAPES=28672x8192 step eager 150 python benchmarks/eager_decode.py
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
"$NCU" --query-metrics > "$OUT/ncu_query.txt" 2>&1
MET=$(grep -oE '^sm__(pipe_[a-z0-9_]+_cycles_active|inst_executed_pipe_[a-z0-9_]+)( |$)' "$OUT/ncu_query.txt" \
      | tr -d ' ' | sort -u | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
echo "metrics: $MET" > "$OUT/ncu_metrics.txt"
step ncu_pipes 150 "$NCU" --profile-from-start off --clock-control none -k regex:_decode_tma_kernel \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --metrics "${MET}${MET:+,}smsp__issue_active.avg.pct_of_peak_sustained_active" \
  python benchmarks/profile_dtma_tokens.py
cat "$OUT/eager.log"
grep -E "^  [_a-z]|Duration|SM Frequency|Issued Warp|No Eligible|Warp Cycles Per Issued|Stall|pipe_|issue_active" \
  "$OUT/ncu_pipes.log" | grep -vE " 0(\.0+)?$| n/a$" | head -120
cat "$OUT/summary.txt"
