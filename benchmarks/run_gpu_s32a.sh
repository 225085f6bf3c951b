#!/usr/bin/env bash
# Prepared in the thirty-first session, not run (~9 min): (1) the GPU tests tightened after that session's
# review (no step-major table made inside a capture, both tile heights; gemv_mma bit-identity with a subnormal
# scale over a zero block); (2) the 256-row decode_tma tile with 4 ring chunks (180 KB) against 3, and its
# equal shares against whole tiles on 28672x8192 once more; (3) the default suite on this tree, to refresh the
# generated part of RESULTS.md (regenerate with --md to a temporary file and splice: the plain report
# overwrites the hand section).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_gemv_mma.py \
  -k "graphs_make_their_own_tables or scale_imad_bit_identical or two_slice"
step big 150 env M=16,64 FMTS=nvfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma r128;dtma r256;dtma r256 _DT_STAGES=4;dtma p132 r256" \
  python benchmarks/exp_ws_knobs.py 28672x8192
step bench 300 python -m microscale.bench --out "$OUT/bench"
tail -n 3 "$OUT/tests.log"
tail -n 10 "$OUT/big.log"
tail -n 5 "$OUT/bench.log"
cat "$OUT/summary.txt"
