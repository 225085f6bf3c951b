#!/usr/bin/env bash
# (Ran once, on a working tree whose end-of-program arrivals were not kept: see NOTES_linear, thirty-second session.)
# Thirty-second session, call b (~8 min): decode_tma's shared tiles arrive at the program's end (one
# release fence, no consumer wait mid-run): (1) its GPU tests, every format (shared tiles, ragged rows);
# (2) the 256-row tile at 16 tokens over 112 whole tiles against equal shares over 113 / 120 / 132 programs,
# and the default tiles on the 8192-row shapes (two K parts per tile); (3) routed ms.linear through the
# suite on this tree against the thirty-first session's (trees/3a21288: old decode, old arrivals).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 220 python -m pytest -q tests/kernels/test_decode_tma.py -k gpu
step shares 200 env M=16 FMTS=nvfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma;dtma r256;dtma r256 p113;dtma r256 p120;dtma r256 p132" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192 8192x28672
CASE=16x28672x8192,16x8192x8192,16x8192x28672 FMT=nvfp4 ROUNDS=2 bash benchmarks/ab_trees.sh \
  > "$OUT/ab.log" 2>&1
tail -n 3 "$OUT/tests.log"
grep -v "^ *clocks" "$OUT/shares.log" | tail -n 18
grep -h "^16x\|^4096x" "$OUT"/*_[12].log 2>/dev/null | cut -c1-90 | head -20
cat "$OUT/summary.txt"
