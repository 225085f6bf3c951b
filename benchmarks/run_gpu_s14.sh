#!/usr/bin/env bash
# Device call of the fourteenth session: decode_tma variants at 16 tokens (code box width,
# chunk length, stream-K shares against one program per tile).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step variants 300 python benchmarks/exp_dtma_variants.py 28672x8192 8192x28672
cat "$OUT/summary.txt"
grep -A40 "^shape" "$OUT/variants.log"
