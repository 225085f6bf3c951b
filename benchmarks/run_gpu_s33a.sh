#!/usr/bin/env bash
# Prepared in the thirty-second session, not run (~9 min): (1) GPU tests left over (decode_tma formats
# the s32/d step did not reach, prefill_ws split tails of every format: the one-fence arrival), and the
# GEMV's 11-op select decode against the 13-op one (bit-identical); (2) the one-token GEMV with
# _GEMV_F4_ROTATE on / off, alternated (switch it on by default if faster); (3) the default suite on this
# tree (regenerate RESULTS' generated part with --md to a temporary file and splice: the plain report
# overwrites the hand section).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_prefill_gluon.py \
  tests/kernels/test_gemv.py -k "int8_affine_g32 or e5m2 or mxint4 or (test_gpu_prefill_ws and True-3) or select_match"
step rotate 120 env M=1 FMTS=nvfp4,mxfp4 ROUNDS=3 DATA=suite VARIANTS="gemv;gemv +_GEMV_F4_ROTATE" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
step bench 300 python -m microscale.bench --out "$OUT/bench"
tail -n 3 "$OUT/tests.log"
grep -v "^ *clocks" "$OUT/rotate.log" | tail -n 8
tail -n 5 "$OUT/bench.log"
cat "$OUT/summary.txt"
