#!/usr/bin/env bash
# Twenty-eighth session, fourth call (~7 min): MXFP8 E5M2 and MXINT4 on the Gluon kernels (E5M2 by
# bit placement as v 2^-112, MXINT4 as the exact code times the E8M0 power of two). GPU tests of
# both kernels on them (and int4 again: its decode PTX gained a register), the fp8 weights first
# used in a graph (E5M2's Inf / NaN refusal), then 16 and 4096 tokens against the Triton prefill kernel.
set -u
. "$(dirname "$0")/gpu_steps.sh"
T=tests/kernels/test_decode_tma.py::test_gpu_decode_tma
P=tests/kernels/test_prefill_gluon.py::test_gpu_prefill_ws
step tests 300 python -m pytest -q "$T[mxfp8_e5m2-True]" "$T[mxint4-True]" "$T[int4_fp16-True]" \
  "$P[True-None-mxfp8_e5m2]" "$P[True-None-mxint4]" "$P[False-3-mxfp8_e5m2]" "$P[True-None-int4_fp16]" \
  tests/kernels/test_linear.py::test_gpu_fp8_weight_first_used_in_a_graph
tail -n 5 "$OUT/tests.log"
M=16,4096 ROUNDS=1 FMTS=mxfp8_e5m2,mxint4 VARIANTS="prefill;linear" \
  step time 200 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
echo "== time"; sed -n '/^Median/,$p' "$OUT/time.log"
cat "$OUT/summary.txt"
