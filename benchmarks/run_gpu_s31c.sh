#!/usr/bin/env bash
# Thirty-first session, third call (~5 min): (1) is ms.linear's 16-token gap to decode_tma in the A/B a matter of
# position (it ran right after cuBLAS)? The two alternated, clocks printed per timing. (2) gemv_mma GPU tests with
# the multiply-add UE4M3 scales now on (bit-identical to the conversion). (3) `--dtype fp16` again, the activations
# now scaled so that the outputs stay finite in fp16 (s31/b: inf at 16 and 4096 tokens, a data range problem).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step order 150 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma;linear;dtma +_SCALE_IMAD;linear +_SCALE_IMAD" python benchmarks/exp_ws_knobs.py 28672x8192
step tests_mma 150 python -m pytest -q tests/kernels/test_gemv_mma.py -k gpu
step bench_fp16 150 python -m microscale.bench --suite matrix --dtype fp16 --formats nvfp4 \
  --shapes 1x28672x8192,16x28672x8192,4096x28672x8192 --out "$OUT/bench_fp16"
grep -E "clocks|^16x" "$OUT/order.log" | head -40
tail -n 12 "$OUT/order.log"
tail -n 3 "$OUT/tests_mma.log"
grep -E "µs|failed" "$OUT/bench_fp16.log" | tail -6
cat "$OUT/summary.txt"
