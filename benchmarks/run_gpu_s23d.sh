#!/usr/bin/env bash
# Twenty-third session: benchmarks/exp_graph_tables.py on this tree and on trees/old (carry "trees").
set -u
. "$(dirname "$0")/gpu_steps.sh"
step new 60 python benchmarks/exp_graph_tables.py
S="$PWD/benchmarks/exp_graph_tables.py"
[ -d trees/old/microscale ] && (cd trees/old && PYTHONPATH="$PWD" step old 60 python "$S")
cat "$OUT/new.log" "$OUT/old.log"; cat "$OUT/summary.txt"
