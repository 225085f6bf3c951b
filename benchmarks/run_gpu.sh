#!/usr/bin/env bash
# Reproduce the GPU results on an H100 / H200. Run from the repository root:
#
#     bash benchmarks/run_gpu.sh [OUT]          # OUT defaults to ./gpu_out
#
# Steps, each under its own time limit so that one slow or hanging step cannot eat the others':
#   tests_kernels, tests_quantize, tests_other, tests_attention
#                 the test files with GPU cases, on CUDA tensors (kernels against the reference)
#   quantize      benchmarks/run_gpu_quantize.py: every quantize / dequantize kernel path bit for bit
#                 against the CPU reference at realistic shapes, then their timings
#                 (OUT/quantize_bench.json)
#   bench         python -m microscale.bench, the default suite (OUT/bench/: results.json,
#                 results.csv, roofline.png, RESULTS.md)
#   matrix        python -m microscale.bench --suite matrix: NVFP4 / MXFP4 at 1-4096 tokens on
#                 8192x8192, 28672x8192 and 8192x28672, 8-bit formats at one token (OUT/matrix/)
#   families      benchmarks/run_gpu_families.py: the MoE, scaled_mm, attention, fused-op, conv2d and
#                 Hadamard kernels on CUDA against their references, every format they take
#   host_time     benchmarks/host_time_gpu.py: CPU time per eager ms.linear call, per route
#   sweep_fp8     benchmarks/sweep_scaled_fp8.py: fast_accum's Triton and Gluon fp8 kernels over their
#                 configs, each checked against float64, then timed beside cuBLAS bf16 (OUT/sweep_fp8.json)
#   sweep_decode  benchmarks/sweep_decode.py --quick: decode_attention and the MoE decode GEMM over their
#                 configs, each checked, timed against copy bandwidth; the MoE decode forward's time split
#                 into its launches (OUT/sweep_decode.json)
#   moe, scaled_mm, kv, ops
#                 the op families' suites (OUT/<suite>/), each case checked before it is timed
# Each step's output goes to OUT/<step>.log; OUT/summary.txt lists every step's exit status and
# seconds. SKIP="tests_kernels matrix" leaves steps out; ONLY="tests_other sweep_fp8 moe" runs just those.
#
# Peers for a GPU machine that cannot reach a package index (torchao's NVFP4 / MX quantizers): install
# them here into .whl/site (git ignores .whl), carry that folder with the working tree, and this script
# puts it on the path after the repository:
#     pip download torchao --no-deps -d .whl && pip install --no-deps --target .whl/site .whl/torchao-*.whl
#
# To update the committed results from a run (the summary above the generated part is kept):
#     cp OUT/bench/results.json OUT/bench/roofline.png benchmarks/
#     python -m microscale.bench report benchmarks/results.json
set -u
OUT="${1:-${OUT:-$PWD/gpu_out}}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OUT PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$PWD/.whl/site" ]; then PYTHONPATH="$PYTHONPATH:$PWD/.whl/site"; fi
: > "$OUT/summary.txt"

step() {  # name, seconds, command...
  local name=$1 secs=$2
  shift 2
  case " ${SKIP:-} " in *" $name "*) echo "$name: skipped" | tee -a "$OUT/summary.txt"; return;; esac
  if [ -n "${ONLY:-}" ]; then
    case " $ONLY " in *" $name "*) ;; *) echo "$name: skipped (ONLY)" | tee -a "$OUT/summary.txt"; return;; esac
  fi
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
}

step tests_kernels 1200 python -m pytest -q tests/kernels --ignore=tests/kernels/test_quantize_kernels.py
step tests_quantize 600 python -m pytest -q tests/kernels/test_quantize_kernels.py
step tests_other 600 python -m pytest -q tests/nn tests/bench tests/scaled tests/moe tests/fusedops tests/reference/test_quantize.py
step tests_attention 300 python -m pytest -q tests/attention
step quantize 600 env SWEEP=0 python benchmarks/run_gpu_quantize.py
step bench 900 python -m microscale.bench --out "$OUT/bench" --md "$OUT/bench/RESULTS.md"
step matrix 1200 python -m microscale.bench --suite matrix --out "$OUT/matrix" --md "$OUT/matrix/RESULTS.md"
step families 600 python benchmarks/run_gpu_families.py
step host_time 120 python benchmarks/host_time_gpu.py --json "$OUT/host_time.json"
step sweep_fp8 600 python benchmarks/sweep_scaled_fp8.py --json "$OUT/sweep_fp8.json"
step sweep_decode 600 python benchmarks/sweep_decode.py --quick --json "$OUT/sweep_decode.json"
for suite in moe scaled_mm kv ops; do
  step "$suite" 900 python -m microscale.bench --suite "$suite" --time-budget "${BUDGET:-600}" --out "$OUT/$suite" \
    --md "$OUT/$suite/RESULTS.md"
done

echo "--- summary ($OUT)"
cat "$OUT/summary.txt"
for f in "$OUT"/tests_*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(tail -n 1 "$f")"; done
! grep -q "rc=[1-9]" "$OUT/summary.txt"
