#!/usr/bin/env bash
# Thirty-third session (~4 min): decode_tma's split epilogue cut down (benchmarks/exp_split_cost.py), 28672x8192
# NVFP4, 16 tokens, 112 / 113 / 132 programs (on 5d20f66's kernel: the patch targets its split epilogue).
set -u
. "$(dirname "$0")/gpu_steps.sh"
PROGRAMS=112,113,132 step split 400 python benchmarks/exp_split_cost.py
cat "$OUT/split.log"
cat "$OUT/summary.txt"
