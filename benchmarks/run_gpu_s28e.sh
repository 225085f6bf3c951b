#!/usr/bin/env bash
# Twenty-eighth session, fifth call (~4 min): the GPU tests of the integer paths after _decode's
# fp16-scale branches were merged (int8 and int4, both kernels, post scale on and off), and the
# plan / routing GPU tests.
set -u
. "$(dirname "$0")/gpu_steps.sh"
T=tests/kernels/test_decode_tma.py::test_gpu_decode_tma
P=tests/kernels/test_prefill_gluon.py::test_gpu_prefill_ws
step tests 400 python -m pytest -q "$T[int8_fp16-True]" "$T[int8_affine_g128-True]" "$T[int8_affine_g128-False]" \
  "$T[int4_affine_g128-True]" "$T[int4_affine_g128-False]" "$P[True-None-int8_fp16]" "$P[True-None-int8_affine_g128]" \
  "$P[True-None-int4_affine_g128]" tests/kernels/test_decode_tma.py::test_gpu_routing_and_graph \
  tests/kernels/test_prefill_gluon.py::test_gpu_routing_switch tests/kernels/test_plans.py
tail -n 5 "$OUT/tests.log"
cat "$OUT/summary.txt"
