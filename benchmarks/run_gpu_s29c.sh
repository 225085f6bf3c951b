#!/usr/bin/env bash
# Twenty-ninth session, third call (~5 min): after the review fixes (E8M0 f16 scale clamped at zero for
# blocks of zero codes, scans keyed on codes and scales): the fp16 GPU tests again with the CUDA-graph
# one, the bf16 graph tests of decode_tma, and MXFP4 / MXFP8 fp16 timings at 16 / 4096 tokens.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests_f16 200 python -m pytest -q tests/kernels/test_gluon_f16.py -k gpu
step tests_bf16 60 python -m pytest -q tests/kernels/test_decode_tma.py -k "graph"
step t_fp16 60 env DTYPE=fp16 M=16,4096 FMTS=mxfp4,mxfp8_e4m3 ROUNDS=1 VARIANTS=linear \
  python benchmarks/exp_ws_knobs.py 28672x8192
tail -n 3 "$OUT/tests_f16.log"
tail -n 3 "$OUT/tests_bf16.log"
tail -n 8 "$OUT/t_fp16.log"
cat "$OUT/summary.txt"
