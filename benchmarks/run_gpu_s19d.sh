#!/usr/bin/env bash
# Nineteenth session, last call, run on commit 6a99258 (whose prep stored its pairs by PTX; on
# main since 7984ebd the prep is a808797's again, so the A/B below compares equal preps): the GEMV
# GPU tests, one A/B of the one-token call and the prep alone (this tree against trees/a808797;
# carry "trees"), then issue 4's matrix (every row as graph replays; ceilings by events).
set -u
. "$(dirname "$0")/gpu_steps.sh"
ROOT=$PWD
step tests 60 python -m pytest -q -x tests/kernels/test_gemv.py -k "back_to_back or chained or prep_x"
for t in . trees/a808797; do
  name=ab_$(basename "$(cd "$t" && pwd)")
  (cd benchmarks && PYTHONPATH="$ROOT/$t" HANDOFF=0 PARTS=0 READS=0 SECONDS_WINDOW=0.4 IDLE=0.5 FMTS=mxfp8_e4m3,nvfp4 \
    step "$name" 80 python exp_noprep.py 8192x8192 28672x8192)
done
step matrix 345 python -m microscale.bench --suite matrix --out "$OUT/matrix" --time-budget 300
tail -3 "$OUT/tests.log"
for f in "$OUT"/ab_*.log; do echo "== $f"; grep -E "^(8192|28672)x" "$f" | tail -12 | awk '{print $1, $2, $3, $4, $6, $7}'; done
tail -3 "$OUT/matrix.log"
cat "$OUT/summary.txt"
