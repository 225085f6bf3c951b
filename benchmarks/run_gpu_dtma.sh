#!/usr/bin/env bash
# Device call of the twelfth session: GPU tests of the TMA-fed decode kernel (and of the
# kernels it sits next to), then the default suite and the E2M1 linear cases at 8 / 9 / 16
# tokens on the issue's three weight shapes.   bash benchmarks/run_gpu_dtma.sh   (~6 min)
set -u
. "$(dirname "$0")/gpu_steps.sh"  # step(), $OUT (SKIP="name ...": steps left out)
step pytest 240 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_prefill_gluon.py \
  tests/kernels/test_gemv_mma.py -k gpu
step bench 220 python -m microscale.bench --out "$OUT/bench"
shapes=""
for m in 8 9 16; do for nk in 8192x8192 28672x8192 8192x28672; do shapes="$shapes${shapes:+,}${m}x$nk"; done; done
step bench_small 200 python -m microscale.bench --suite linear --formats nvfp4,mxfp4 --shapes "$shapes" \
  --out "$OUT/bench_small"
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error" "$OUT"/pytest.log | tail -3
tail -n 2 "$OUT/bench.log" "$OUT/bench_small.log"
