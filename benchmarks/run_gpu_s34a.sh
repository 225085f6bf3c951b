#!/usr/bin/env bash
# Prepared in the thirty-third session, not run (~9 min): GPU tests on the tree with first-program sums for
# 256-row tiles and _DT_ONE_TABLE on by default that the session's device time did not reach: decode_tma
# for every format (128-row path unchanged, but the one-table default routes E2M1 differently), the fp16
# Gluon kernels (E2M1 with fp16 activations now read the 4-d scale view), the routing / eager tests.
# Then run_gpu_s33b.sh: the default suite, to refresh RESULTS.md's generated part.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests_dtma 330 python -m pytest -q tests/kernels/test_decode_tma.py -k "test_gpu"
step tests_f16 200 python -m pytest -q tests/kernels/test_gluon_f16.py -k "test_gpu"
tail -n 3 "$OUT/tests_dtma.log" "$OUT/tests_f16.log"
cat "$OUT/summary.txt"
