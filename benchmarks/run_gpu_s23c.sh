#!/usr/bin/env bash
# Twenty-third session: per-weight tables made inside CUDA graph captures (decode_tma's step-major
# scales). The new GPU test on this tree and on trees/old (main before the fix: `git archive
# <rev> microscale | tar -x -C trees/old`, carry "trees"), the decode_tma / gemv tests, and
# ms.linear against decode_tma at 9-16 tokens in graphs on small weights (~5 min).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q -x tests/kernels/test_decode_tma.py tests/kernels/test_plans.py
if [ -d trees/old/microscale ]; then  # from inside the old tree: python -m puts the working directory first
  T="$PWD/tests/kernels/test_decode_tma.py"
  (cd trees/old && PYTHONPATH="$PWD" step old 120 python -m pytest -q "$T" -k graphs_make_their_own -p no:cacheprovider)
fi
M=16,9 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="linear;dtma" step t16 300 python benchmarks/exp_ws_knobs.py 8192x8192 4096x4096
tail -3 "$OUT/tests.log"; [ -f "$OUT/old.log" ] && grep -E "passed|failed|assert" "$OUT/old.log" | tail -4
tail -12 "$OUT/t16.log"
cat "$OUT/summary.txt"
