#!/usr/bin/env bash
# Twenty-eighth session, third call (~4 min): where prefill_ws overtakes the Triton prefill kernel on
# 8-bit integers with fp16 scales in blocks of 32 (int8_fp16, int8_affine_g32): 33-128 tokens
# (the second call had the Triton kernel 3-11% ahead at 64 tokens for int8_fp16).
set -u
. "$(dirname "$0")/gpu_steps.sh"
M=33,48,64,96,128 ROUNDS=1 FMTS=int8_fp16,int8_affine_g32,int8_affine_g128 VARIANTS="prefill;ws" \
  step ws 400 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
echo "== ws"; sed -n '/^Median/,$p' "$OUT/ws.log"
cat "$OUT/summary.txt"
