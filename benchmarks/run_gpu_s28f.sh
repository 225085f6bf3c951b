#!/usr/bin/env bash
# Twenty-eighth session, last call (~6 min): the default suite on the final tree (the generated part
# of benchmarks/RESULTS.md), then the suite's linear cases for the formats moved onto the Gluon
# kernels this session (8-bit integers, MXFP8 E5M2, MXINT4; their rows go to RESULTS by hand).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step bench 240 python -m microscale.bench --out "$OUT/bench"
step bench8 200 python -m microscale.bench --ops linear --formats int8_fp16,int8_affine_g128,mxint8,mxfp8_e5m2,mxint4 \
  --out "$OUT/bench8"
tail -n 22 "$OUT/bench8.log"
cat "$OUT/summary.txt"
