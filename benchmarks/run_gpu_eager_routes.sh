#!/usr/bin/env bash
# Prepared in the twenty-fourth session, not yet run (~3 min): eager routes at 2-8 tokens,
# alternated and clock-aware (benchmarks/exp_eager_routes.py), to settle DECODE_TMA_EAGER_MIN_M.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step eager_routes 400 python benchmarks/exp_eager_routes.py
tail -14 "$OUT/eager_routes.log"
cat "$OUT/summary.txt"
