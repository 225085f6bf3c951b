#!/usr/bin/env bash
# Thirty-second session, call a (~8 min): (1) GPU tests of the kernels whose decode (11-op select of
# E2M1 pairs) or split arrival (one fence per thread, arrive_asm) changed, with the tests tightened after
# the thirty-first session's review; (2) decode_tma's 256-row tile at 16 tokens over 112 whole tiles against
# equal stream-K shares over 113 / 120 / 132 programs (the shares lost 5.7 µs with a MEMBAR.ALL.GPU per
# accumulator row; now one per thread), and with 4 ring chunks.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 260 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_gemv_mma.py \
  tests/kernels/test_prefill_gluon.py -k "gpu and (fp4 or routing or graph or eager or imad or small_weight)"
step shares 200 env M=16 FMTS=nvfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma r128;dtma r256;dtma r256 p113;dtma r256 p120;dtma r256 p132;dtma r256 _DT_STAGES=4" \
  python benchmarks/exp_ws_knobs.py 28672x8192
tail -n 3 "$OUT/tests.log"
grep -v "^ *clocks" "$OUT/shares.log" | tail -n 12
cat "$OUT/summary.txt"
