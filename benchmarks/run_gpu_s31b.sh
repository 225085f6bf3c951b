#!/usr/bin/env bash
# Prepared in the thirtieth session, not run (~9 min): the prefill_ws GPU tests on the tree with the multiply-add
# scales (15 of 52 passed in s30/c before that step's limit), and `--dtype fp16` of the benchmark harness once.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests_ws 420 python -m pytest -q tests/kernels/test_prefill_gluon.py -k gpu
step bench_fp16 100 python -m microscale.bench --suite matrix --dtype fp16 --formats nvfp4 \
  --shapes 1x28672x8192,16x28672x8192,4096x28672x8192 --out "$OUT/bench_fp16"
tail -n 3 "$OUT/tests_ws.log"
grep -E "nvfp4" "$OUT/bench_fp16.log" | tail -3
cat "$OUT/summary.txt"
