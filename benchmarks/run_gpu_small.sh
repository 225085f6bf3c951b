#!/usr/bin/env bash
# One-token GEMV configurations on the small shape (8192x8192), where 8-bit weights missed
# issue 4's 1.8x in the fifteenth session (MXFP8 1.70x, int8 1.52x, MXINT8 1.57x at ~76% of
# copy): exp_power.py's burst / steady time per configuration, all formats, then the 8-bit
# candidates on 28672x8192 against the default (no regression there). nvidia-smi samples
# beside it (queries only).        bash benchmarks/run_gpu_small.sh   (~4 min)
set -u
. "$(dirname "$0")/gpu_steps.sh"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
  --format=csv -lms 100 > "$OUT/smi.csv" 2>&1 &
SMI=$!
export IDLE=${IDLE:-1.0} SECONDS_WINDOW=${SECONDS_WINDOW:-0.8}
V8="default;prefetch;rows 2;rows 2, prefetch;rows 8, prefetch;kw 512;kw 128, prefetch;warps 4;warps 1;split 2"
FMTS=mxfp8_e4m3,int8_fp16,mxint8 VARIANTS="$V8" step small8 300 python benchmarks/exp_power.py 8192x8192
FMTS=nvfp4,mxfp4 VARIANTS="default;rows 2;rows 8;kw 512;kw 128;warps 4;split 2" \
  step small4 200 python benchmarks/exp_power.py 8192x8192
FMTS=mxfp8_e4m3,int8_fp16,mxint8 VARIANTS="${VBIG:-default;prefetch}" ROUNDS=2 \
  step big8 150 python benchmarks/exp_power.py 28672x8192
kill $SMI
for f in small8 small4 big8; do grep -v Warning "$OUT/$f.log" | sed -n '/1 token/,$p'; done
cat "$OUT/summary.txt"
