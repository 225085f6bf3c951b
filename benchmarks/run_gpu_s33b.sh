#!/usr/bin/env bash
# Prepared in the thirty-second session, still not run after the thirty-third (~6 min): the default suite on
# this tree, to refresh the generated part of RESULTS.md (regenerate with --md to a temporary file and splice: the plain report
# overwrites the hand section).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step bench 420 python -m microscale.bench --out "$OUT/bench"
tail -n 5 "$OUT/bench.log"
cat "$OUT/summary.txt"
