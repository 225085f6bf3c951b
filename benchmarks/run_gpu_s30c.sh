#!/usr/bin/env bash
# Thirtieth session, third call (~9 min): the GPU tests of the Gluon kernels after making per-warp slot release
# and the multiply-add scales the defaults (decode_tma, prefill_ws, the fp16 decodes).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests_dtma 260 python -m pytest -q tests/kernels/test_decode_tma.py -k gpu
step tests_f16 130 python -m pytest -q tests/kernels/test_gluon_f16.py -k gpu
step tests_ws 150 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
tail -n 3 "$OUT/tests_dtma.log" "$OUT/tests_f16.log" "$OUT/tests_ws.log"
cat "$OUT/summary.txt"
