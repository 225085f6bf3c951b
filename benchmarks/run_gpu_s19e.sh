#!/usr/bin/env bash
# Nineteenth session, leftover device time: int8_fp16 at one token on 8192x8192, one warp per
# program, with the prep (default) against x_direct (no prep; branch exp/gemv-x-direct, made with
# `git archive exp/gemv-x-direct microscale | tar -x -C trees/xd`; carry "trees").
set -u
. "$(dirname "$0")/gpu_steps.sh"
ROOT=$PWD
(cd benchmarks && PYTHONPATH="$ROOT/trees/xd" VARIANTS="num_warps=1;x_direct=1 num_warps=1" FMTS=int8_fp16 ROUNDS=3 \
  IDLE=0.8 SECONDS_WINDOW=0.6 step xd 120 python exp_power.py 8192x8192)
tail -12 "$OUT/xd.log"
cat "$OUT/summary.txt"
