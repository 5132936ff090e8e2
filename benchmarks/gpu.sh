#!/usr/bin/env bash
# One prepared script for a lent GPU: every piece has its own time limit
# (killed 10 s after it), the limits add up to 8 minutes so the whole run
# ends well inside a 10-minute call, and after every piece what exists so
# far is packed into $OUT: a call killed at its limit still brings back the
# pieces that finished.
#
#   OUT=/some/dir bash benchmarks/gpu.sh          # on the GPU machine
#   OUT=/tmp/gpu_smoke bash benchmarks/gpu.sh --tiny   # CPU smoke test
#
# $OUT receives at most six files: gpu_log.txt, the three timing reports
# (step_time_layouts_gpu.md, step_time_gpu.md, update_time_gpu.md), device_peaks.jsonl and
# gpu_results.tgz (everything, the JSON, memory and convergence reports
# included). The pieces work in $WORK (default: a fresh temporary folder).
# The Python used is $PYTHON, else the first of `python`, `python3` and
# /opt/torch/.venv/bin/python3 that imports jax (on the lent machines the
# plain `python3` has no jax; the image's venv has).
#
# Pieces (limits in seconds):
#   1. optimizer step time of every FOAM layout (float32 and bfloat16,
#      fold axis -2 and -1, levels 1-4, FOAM-Mini, int8 moments) against
#      AdamW at 50M and 100M params (benchmarks/step_time.py; written after
#      every size, so a piece cut short keeps the sizes it finished)  150
#   2. the same at ~1B params, bfloat16, the main layouts               60
#   3. memory: 60M compiled peaks and the 80 GiB fit at 7B width, with
#      the GPU compiler (the analytic part is device-independent)       90
#   4. real peak bytes in use of 60M train steps (3 processes x 30)     90
#   5. LLaMA-60M (bytes) on this machine's CPython stdlib corpus, AdamW
#      vs FOAM at their best lrs of the CPU horizon study's longest tiny
#      horizon, as many steps as fit 30 s of training (horizon_gpu.py)  60
#   6. the compile report's update step timed on this GPU, beside the
#      bytes its compiler counts (update_time.py; update_time_gpu.md)   30
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/foam_gpu_out}"
WORK="${WORK:-$(mktemp -d)}"
mkdir -p "$OUT" "$WORK"
TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
# Time limits scale on a CPU smoke test (quick modes compile slowly there).
SCALE=$(( TINY ? 4 : 1 ))
lim() { echo $(( $1 * SCALE )); }
LOG="$WORK/gpu_log.txt"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
failed=0
fail() { failed=$((failed + 1)); say "$@"; }
# Copies what the pieces wrote so far into $OUT (a few files).
pack() {
  cp "$LOG" "$OUT/" 2>/dev/null
  cp "$WORK"/*.md "$WORK"/device_peaks.jsonl "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu_results.tgz.part" -C "$WORK" . 2>/dev/null \
    && mv "$OUT/gpu_results.tgz.part" "$OUT/gpu_results.tgz"
}
run_piece() {  # run_piece LIMIT NAME COMMAND...: one piece, then pack.
  local limit=$1 name=$2
  shift 2
  timeout -k 10 "$(lim "$limit")" "$@" >> "$LOG" 2>&1 || fail "$name: rc $?"
  pack
}
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  for candidate in python python3 /opt/torch/.venv/bin/python3; do
    if "$candidate" -c "import jax" 2>/dev/null; then PY=$candidate; break; fi
  done
fi
if [[ -z "$PY" ]]; then say "no python that imports jax; set PYTHON"; pack; exit 1; fi

{
  date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null
  echo "python: $PY"
  "$PY" -c "import jax, jaxlib, optax, flax; print('jax', jax.__version__, jaxlib.__version__, 'optax', optax.__version__, 'flax', flax.__version__, jax.devices())"
} >> "$LOG" 2>&1

# Every layout of the step-time requirement (benchmarks/results/step_time.md).
LAYOUTS=adamw,foam_l1,foam,foam_l3,foam_l4,foam_l1_ax1,foam_l2_ax1,foam_l3_ax1,foam_l4_ax1,foam_mini,foam_int8
if (( TINY )); then
  LAYOUT_ARGS=(--sizes 1m --dtypes float32,bfloat16 --optimizers "$LAYOUTS"
               --repeats 2 --inner 1 --warmup 1)
  STEP_ARGS=(--quick)
  MEM_ARGS=(--quick)
  PEAK_CONFIGS=("tiny:adamw" "tiny:foam")
  PEAK_ARGS=(--quick)
  CONV_ARGS=(--quick --seconds 4)
  UPDATE_ARGS=(--repeats 2 --inner 1 --warmup 1 --dtypes float32)
else
  LAYOUT_ARGS=(--sizes 50m,100m --dtypes float32,bfloat16 --optimizers "$LAYOUTS"
               --repeats 40 --inner 5 --warmup 3)
  STEP_ARGS=(--sizes 1b --dtypes bfloat16
             --optimizers adamw,lion,foam,foam_l2_ax1,foam_mini,foam_int8
             --repeats 10 --train 60m
             --train-optimizers adamw,foam,foam_mini)
  MEM_ARGS=(--skip analytic --configs 60m --budgets 80 --no-verify
            --optimizers adamw adafactor lion foam foam_mini --widths 7b)
  PEAK_CONFIGS=("60m:adamw" "60m:foam" "60m:foam_mini")
  PEAK_ARGS=(--batch 8 --seq-len 256)
  CONV_ARGS=(--seconds 30)
  UPDATE_ARGS=(--repeats 20 --inner 10 --warmup 3)
fi

say "1. step time of every layout"
run_piece 150 "step time layouts" "$PY" -m benchmarks.step_time "${LAYOUT_ARGS[@]}" \
  --out "$WORK/step_time_layouts_gpu.md"

say "2. step time at ~1B"
run_piece 60 "step time" "$PY" -m benchmarks.step_time "${STEP_ARGS[@]}" \
  --out "$WORK/step_time_gpu.md"

say "3. memory (compiled on this device)"
run_piece 90 memory "$PY" -m benchmarks.memory "${MEM_ARGS[@]}" --out "$WORK/memory"

say "4. real peak bytes in use"
for pair in "${PEAK_CONFIGS[@]}"; do
  timeout -k 10 "$(lim 30)" "$PY" -m benchmarks.memory "${PEAK_ARGS[@]}" --device-peak "$pair" \
    2>> "$LOG" | tail -n 1 >> "$WORK/device_peaks.jsonl" || fail "peak $pair: rc $?"
done
pack

say "5. convergence: AdamW vs FOAM at 60m on this machine's stdlib corpus"
run_piece 60 convergence "$PY" -m benchmarks.horizon_gpu "${CONV_ARGS[@]}" \
  --out "$WORK/horizon_gpu"

say "6. the update step timed, beside its compiler's bytes"
run_piece 30 "update time" "$PY" -m benchmarks.update_time "${UPDATE_ARGS[@]}" \
  --out "$WORK/update_time_gpu.md"

say "done"
ls -R "$WORK" >> "$LOG"
say "$failed piece(s) failed"
pack
exit "$failed"
