#!/usr/bin/env bash
# Prepared in the thirty-second session, not run (~9 min): (1) GPU tests left over (decode_tma formats the
# s32/d step did not reach, prefill_ws split tails of every format: the one-fence arrival), the GEMV's 11-op
# select decode against the 13-op one (bit-identical), and _DT_ONE_TABLE (128-row tiles reading the 256-row
# scale table, 256-row tiles from 33 tokens); (2) the one-token GEMV with _GEMV_F4_ROTATE on / off,
# alternated (switch it on by default if faster); (3) decode_tma with _DT_ONE_TABLE on / off at 16 and 64
# tokens on the issue's shapes (on by default if 16 tokens lose < 1% and 64 tokens gain on 8192-row weights).
# Then run_gpu_s33b.sh: the default suite.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_prefill_gluon.py \
  tests/kernels/test_gemv.py -k "(test_gpu_decode_tma and (int8_affine_g32 or e5m2 or mxint4 or one)) or (test_gpu_prefill_ws and True-3) or select_match"
step rotate 120 env M=1 FMTS=nvfp4,mxfp4 ROUNDS=3 DATA=suite VARIANTS="gemv;gemv +_GEMV_F4_ROTATE" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
step onetable 170 env M=16,64 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma +_DT_ONE_TABLE" \
  python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672 28672x8192
tail -n 3 "$OUT/tests.log"
grep -v "^ *clocks" "$OUT/rotate.log" | tail -n 8
grep -v "^ *clocks" "$OUT/onetable.log" | tail -n 14
cat "$OUT/summary.txt"
