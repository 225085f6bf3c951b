#!/usr/bin/env bash
# Twenty-seventh session, first call (~8 min): the GEMV's 4-bit integer decode (one lop3 per pair,
# odd nibbles in place with an fma of 1/16, zero points loaded once per chain). GPU tests of the
# integer GEMV paths, then 1-4 tokens of int4 formats: this tree (routed, GEMV, decode_tma) and the
# GEMV of the previous tree (old_s27/, an untracked snapshot of db18083's package).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_gemv.py -k "int4 or int8 or mxint or scale_direct or asm_text"
tail -n 5 "$OUT/tests.log"
M=1,2,3,4 ROUNDS=1 FMTS=int4_affine_g128,int4_fp16,int4_affine_g32 VARIANTS="linear;gemv;dtma" \
  step new 260 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
M=1,2,4 ROUNDS=1 FMTS=int4_affine_g128,int4_fp16,int4_affine_g32 VARIANTS="gemv" PYTHONPATH="$PWD/old_s27:$PYTHONPATH" \
  step old 150 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
for s in new old; do echo "== $s"; sed -n '/^Median/,$p' "$OUT/$s.log"; done
cat "$OUT/summary.txt"
