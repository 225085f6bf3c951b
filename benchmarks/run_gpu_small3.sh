#!/usr/bin/env bash
# Seventeenth session, third call: two-token GEMV configurations on the three shapes (the
# one-token change, 2 rows per program on 8192-row weights and early loads, tried at M=2),
# then the GEMV tests on the GPU (PTX path; the chosen configs against float64).
set -u
. "$(dirname "$0")/gpu_steps.sh"
export IDLE=0.8 SECONDS_WINDOW=0.6 TOKENS=2
V="default;prefetch=1;block_n=2 prefetch=1;block_n=2"
for s in 8192x8192 8192x28672 28672x8192; do
  FMTS=nvfp4,mxfp4,mxfp8_e4m3 VARIANTS="$V" step m2_$s 150 python benchmarks/exp_power.py $s
done
step tests 200 python -m pytest -q -x tests/kernels/test_gemv.py -k "default_config or matches_float64 or scale_direct"
for s in 8192x8192 8192x28672 28672x8192; do grep -v Warning "$OUT/m2_$s.log" | sed -n '/token/,$p'; done
tail -3 "$OUT/tests.log"
cat "$OUT/summary.txt"
