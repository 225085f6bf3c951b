#!/usr/bin/env bash
# Thirty-third session (~7 min): decode_tma's shared tiles added up by their first program (later parts
# signal by reductions, no atomic round trip). GPU tests of decode_tma, program counts 112 / 113 / 132 on
# 28672x8192 at 16 tokens, and dtma at 16 / 64 tokens on the issue's shapes (132 equal shares too).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_decode_tma.py -k "test_gpu"
step programs 90 python benchmarks/profile_dtma_programs.py time
step dtma 150 env M=16,64 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="dtma" \
  python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672 28672x8192
step p132 60 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma r256 p132" \
  python benchmarks/exp_ws_knobs.py 28672x8192
tail -n 3 "$OUT/tests.log"
cat "$OUT/programs.log"
grep -v "^ *clocks" "$OUT/dtma.log" | tail -n 9
grep -v "^ *clocks" "$OUT/p132.log" | tail -n 6
cat "$OUT/summary.txt"
