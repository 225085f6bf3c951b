# Shared by the one-call GPU scripts (run_gpu_all.sh, run_gpu_pending.sh); source it from the
# repo root. Sets PYTHONPATH and OUT (default ./gpu_out), empties $OUT/summary.txt, and
# defines step(): each step has its own time limit so one slow or hanging step cannot eat the
# others' time; SKIP="name name" leaves steps out.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
step() {  # name, seconds, command...
  local name=$1 secs=$2
  shift 2
  case " ${SKIP:-} " in *" $name "*) echo "$name: skipped" | tee -a "$OUT/summary.txt"; return;; esac
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
}
: > "$OUT/summary.txt"
