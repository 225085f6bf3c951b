#!/usr/bin/env bash
# Twenty-fifth session, last call (~1.5 min): the eager A/B again on the final plan launches
# (descriptors encoded once and tensors as addresses), all three shapes.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step eager_routes 300 python benchmarks/exp_eager_routes.py
tail -n 28 "$OUT/eager_routes.log"
cat "$OUT/summary.txt"
