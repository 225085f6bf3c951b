#!/usr/bin/env bash
# Twenty-fourth session, last call (~2.5 min): why eager decode_tma loops at 4-8 tokens are slower
# than its graphs (benchmarks/exp_eager_tok8.py), then the GPU routing / plans tests on this tree.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step eager8 90 python benchmarks/exp_eager_tok8.py
step tests 150 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_plans.py -k gpu \
    -p no:cacheprovider
cat "$OUT/eager8.log" | tail -6
tail -2 "$OUT/tests.log"
cat "$OUT/summary.txt"
