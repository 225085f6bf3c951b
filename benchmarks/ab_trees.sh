#!/usr/bin/env bash
# Time one linear case on several source trees, alternated (to find where a timing moved).
# Make the trees here first, from commits:   bash benchmarks/ab_trees.sh --prep SHA [SHA ...]
# (each goes to ./trees/SHA, git-ignored: pass carry=["trees"] to the device run), then on
# the GPU:   CASE=1x28672x8192 FMT=nvfp4 ROUNDS=2 bash benchmarks/ab_trees.sh
# "." (this tree) is always timed too. Environment variables such as MICROSCALE_PLANS=0 apply
# to every tree.
set -u -o pipefail
if [ "${1:-}" = "--prep" ]; then
  shift
  for rev in "$@"; do
    sha=$(git rev-parse --short "$rev^{commit}") || exit 1
    rm -rf "trees/$sha" && mkdir -p "trees/$sha" && git archive "$sha" microscale | tar -x -C "trees/$sha" || exit 1
    echo "trees/$sha ($rev)"
  done
  exit 0
fi
. "$(dirname "$0")/gpu_steps.sh"
OUT=$(cd "$OUT" && pwd)  # the steps below run from inside the trees
CASE=${CASE:-1x28672x8192}
FMT=${FMT:-nvfp4}
ROOT=$PWD
for r in $(seq "${ROUNDS:-2}"); do
  for t in . trees/*; do
    [ -d "$t/microscale" ] || continue
    name=$(basename "$(cd "$t" && pwd)")_$r
    (cd "$t" && PYTHONPATH="$PWD" step "$name" 90 python -m microscale.bench --suite linear --formats "$FMT" \
      --shapes "$CASE" --out "$OUT/$name")
    echo "$name $(grep -A1 '^\[' "$OUT/$name.log" | tail -1 | cut -c1-100)"
  done
done
cd "$ROOT" && cat "$OUT/summary.txt"
