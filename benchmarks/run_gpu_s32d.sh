#!/usr/bin/env bash
# Thirty-second session, call d (~6 min): GPU tests of the final tree's decode_tma (every format: the
# one-fence split arrival touches all; E2M1 the new select decode) and prefill_ws's split tails (every
# format, 3 programs), then routed ms.linear through the suite on this tree against the thirty-first
# session's (trees/3a21288), alternated, at 16 tokens on the issue's three shapes (NVFP4).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_prefill_gluon.py \
  -k "test_gpu_decode_tma or (test_gpu_prefill_ws and True-3)"
CASE=16x28672x8192,16x8192x8192,16x8192x28672 FMT=nvfp4 ROUNDS=2 bash benchmarks/ab_trees.sh > "$OUT/ab.log" 2>&1
tail -n 3 "$OUT/tests.log"
for f in "$OUT"/main_*.log "$OUT"/3a21288_*.log; do echo "== $f"; grep -E "^\| *16x|16x(28672|8192)" "$f" | head -8; done
cat "$OUT/summary.txt"
