#!/usr/bin/env bash
# Eighteenth session: one-warp GEMV programs for 8-bit codes at one token on 8192-row weights
# (the seventeenth session's sweep had 1 warp 0.2-0.3 us ahead of the default there), two rounds.
set -u
. "$(dirname "$0")/gpu_steps.sh"
export IDLE=0.8 SECONDS_WINDOW=0.6 ROUNDS=2
V="default;num_warps=1;num_warps=1 block_kw=512;num_warps=1 block_n=4;num_warps=1 num_stages=2"
FMTS=mxfp8_e4m3,int8_fp16,mxint8 VARIANTS="$V" step w_8192x8192 240 python benchmarks/exp_power.py 8192x8192
FMTS=mxfp8_e4m3,int8_fp16,mxint8 VARIANTS="default;num_warps=1;num_warps=1 block_kw=512" step w_8192x28672 200 python benchmarks/exp_power.py 8192x28672
for s in w_8192x8192 w_8192x28672; do grep -v Warning "$OUT/$s.log" | sed -n '/token/,$p'; done
cat "$OUT/summary.txt"
