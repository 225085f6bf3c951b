#!/usr/bin/env bash
# Device call of the fourteenth session: GPU tests of decode_tma (stream-K shares, 128-byte
# code boxes) and the routes next to it, the variants at 16 tokens, and the issue's E2M1
# linear cases at 9 / 16 tokens on its three weight shapes.   bash benchmarks/run_gpu_s14.sh
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_plans.py tests/kernels/test_linear.py -k "gpu or plan or decode"
step variants 120 python benchmarks/exp_dtma_variants.py 28672x8192 8192x28672 8192x8192
shapes=""
for m in 9 16; do for nk in 8192x8192 28672x8192 8192x28672; do shapes="$shapes${shapes:+,}${m}x$nk"; done; done
step bench_small 200 python -m microscale.bench --suite linear --formats nvfp4,mxfp4 --shapes "$shapes" \
  --out "$OUT/bench_small"
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error" "$OUT"/tests.log | tail -3
grep -A40 "^shape" "$OUT/variants.log"
tail -n 30 "$OUT/bench_small.log"
