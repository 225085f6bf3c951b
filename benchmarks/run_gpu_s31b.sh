#!/usr/bin/env bash
# Thirty-first session, second call (~7 min): why ms.linear is ~3 µs behind decode_tma at 16 tokens in graphs
# (exp_route_gap.py: launches recorded in the capture, both timed); the prefill_ws GPU tests of the formats the
# multiply-add scales changed (UE4M3 / E8M0; s30/c ran 15 of 52 before its limit); `--dtype fp16` of the harness once.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step route_gap 120 python benchmarks/exp_route_gap.py
step tests_ws 330 python -m pytest -q tests/kernels/test_prefill_gluon.py \
  -k "test_gpu_prefill_ws and (nvfp4 or mxfp4 or mxfp8 or mxint8 or mxint4)"
step bench_fp16 120 python -m microscale.bench --suite matrix --dtype fp16 --formats nvfp4 \
  --shapes 1x28672x8192,16x28672x8192,4096x28672x8192 --out "$OUT/bench_fp16"
cat "$OUT/route_gap.log"
tail -n 3 "$OUT/tests_ws.log"
grep -E "nvfp4|cuBLAS" "$OUT/bench_fp16.log" | tail -6
cat "$OUT/summary.txt"
