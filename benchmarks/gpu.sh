#!/usr/bin/env bash
# One prepared script for a lent GPU: every piece has its own time limit so
# the whole run ends inside 10 minutes, and everything lands in $OUT.
#
#   OUT=/some/dir bash benchmarks/gpu.sh          # on the GPU machine
#   OUT=/tmp/gpu_smoke bash benchmarks/gpu.sh --tiny   # CPU smoke test
#
# Pieces (limits in seconds):
#   1. optimizer step time of every FOAM layout (float32 and bfloat16,
#      fold axis -2 and -1, levels 1-4, FOAM-Mini, int8 moments) against
#      AdamW at 50M and 100M params (benchmarks/step_time.py)         160
#   2. the same at ~1B params, bfloat16, the main layouts               60
#   3. memory: 60M compiled peaks and the 80 GiB fit at 7B width, with
#      the GPU compiler (the analytic part is device-independent)      120
#   4. real peak bytes in use of 60M train steps (3 processes x 40)     120
#   5. LLaMA-60M (bytes) on Tiny Shakespeare, FOAM vs AdamW, 2 lrs     130
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/foam_gpu_out}"
mkdir -p "$OUT"
TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
# Time limits scale on a CPU smoke test (quick modes compile slowly there).
SCALE=$(( TINY ? 4 : 1 ))
lim() { echo $(( $1 * SCALE )); }
LOG="$OUT/gpu_log.txt"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
failed=0
fail() { failed=$((failed + 1)); say "$@"; }

{
  date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null
  python -c "import jax, jaxlib; print('jax', jax.__version__, jaxlib.__version__, jax.devices())"
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
  CONV_ARGS=(--quick)
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
  CONV_ARGS=(--plan gpu)
fi

say "1. step time of every layout"
timeout "$(lim 160)" python -m benchmarks.step_time "${LAYOUT_ARGS[@]}" \
  --out "$OUT/step_time_layouts_gpu.md" >> "$LOG" 2>&1 || fail "step time layouts: rc $?"

say "2. step time at ~1B"
timeout "$(lim 60)" python -m benchmarks.step_time "${STEP_ARGS[@]}" \
  --out "$OUT/step_time_gpu.md" >> "$LOG" 2>&1 || fail "step time: rc $?"

say "3. memory (compiled on this device)"
timeout "$(lim 120)" python -m benchmarks.memory "${MEM_ARGS[@]}" --out "$OUT/memory" \
  >> "$LOG" 2>&1 || fail "memory: rc $?"

say "4. real peak bytes in use"
for pair in "${PEAK_CONFIGS[@]}"; do
  timeout "$(lim 40)" python -m benchmarks.memory "${PEAK_ARGS[@]}" --device-peak "$pair" \
    2>> "$LOG" | tail -n 1 >> "$OUT/device_peaks.jsonl" || fail "peak $pair: rc $?"
done

say "5. convergence"
timeout "$(lim 130)" python -m benchmarks.convergence "${CONV_ARGS[@]}" \
  --out "$OUT/convergence" >> "$LOG" 2>&1 || fail "convergence: rc $?"

say "done"
ls -R "$OUT" >> "$LOG"
say "$failed piece(s) failed"
exit "$failed"
