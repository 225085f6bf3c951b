#!/usr/bin/env bash
# Nineteenth session: the prep storing its f16 pairs by PTX from the registers that loaded them
# (no shared-memory shuffle): GEMV GPU tests, then the one-token call and the prep alone on this
# tree and on trees/a808797 (the prep before; make it with: bash benchmarks/ab_trees.sh --prep a808797,
# and carry "trees"), two alternated rounds.
set -u
. "$(dirname "$0")/gpu_steps.sh"
ROOT=$PWD
step tests 150 python -m pytest -q -x tests/kernels/test_gemv.py -k "default_config or back_to_back or chained or prep"
for r in 1 2; do
  for t in . trees/a808797; do
    name=ab_$(basename "$(cd "$t" && pwd)")_$r
    (cd benchmarks && PYTHONPATH="$ROOT/$t" HANDOFF=0 PARTS=0 READS=0 SECONDS_WINDOW=0.4 IDLE=0.5 step "$name" 110 python exp_noprep.py 8192x8192 28672x8192)
  done
done
tail -3 "$OUT/tests.log"
for f in "$OUT"/ab_*.log; do echo "== $f"; grep -E "^(8192|28672)x" "$f" | tail -16 | awk '{print $1, $2, $3, $4, $6, $7}'; done
cat "$OUT/summary.txt"
