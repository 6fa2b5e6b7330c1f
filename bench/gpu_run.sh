#!/usr/bin/env bash
# The one prepared GPU run (issue 17, part 4-5): every replayable system with structure replayed on
# a real-scale architecture (random weights, bf16; the 98 MB GGUF does not travel to the GPU machine,
# so the SmolLM2 architecture runs as arch:smollm2-135m), CUDA-event timing and NVML counters at
# 20 Hz (bench/gpu_capture.py); batch-1 decode bandwidth efficiency of the engine path, the static
# path and its torch.compile / CUDA-graph versions (bench/decode_efficiency.py); `solm validate`
# and `solm validate --uncalibrated` on every trace; the part's own GEMM times (bench/gemm_profile.py)
# and the GEMM tile model calibrated on them (solm calibrate). Each step has its own time limit, and one
# failing step does not stop the others; everything lands under $OUT with a log per step.
#
#   GPU:        bash bench/gpu_run.sh                      (OUT=traces/gpu-h200, about 8 minutes)
#   CPU check:  DEVICE=cpu ARCH=tiny-llama SMALL=tiny-qwen2 N=1 MAX_TOKENS=6 CONTEXT=32 PASSES=8 \
#               GEMM_ARGS="--m 1,8 --n 64,128 --k 64,128 --iters 2 --trials 2" \
#               OUT=/tmp/gpu-run-check bash bench/gpu_run.sh
set -u
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEVICE=${DEVICE:-cuda}
ARCH=${ARCH:-llama-3-8b}
SMALL=${SMALL:-smollm2-135m}
OUT=${OUT:-traces/gpu-h200}
N=${N:-4}
MAX_TOKENS=${MAX_TOKENS:-64}
CONTEXT=${CONTEXT:-512}
PASSES=${PASSES:-64}
STEP_LIMIT=${STEP_LIMIT:-240}
HARDWARE=${HARDWARE:-h200}  # the catalog part this machine is, for solm calibrate
GEMM_ARGS=${GEMM_ARGS:-}    # bench/gemm_profile.py grid flags (default: its LLM grid, 160 GEMMs)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
status=0
step() {  # step NAME CMD...: run with a time limit, log to $OUT/NAME.log, keep going on failure
  local name=$1; shift
  local t0=$SECONDS
  timeout --kill-after=10 "$STEP_LIMIT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s  ($OUT/$name.log)"
  tail -n 1 "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
for arch in "$ARCH" "$SMALL"; do
  step "capture-$arch" "$PY" bench/gpu_capture.py --arch "$arch" --device "$DEVICE" --n "$N" \
    --max-tokens "$MAX_TOKENS" --counters-hz 20 --out "$OUT/$arch" --force
done
# the part's own GEMM times, and the tile model calibrated on them (solm calibrate; docs/cost_model.md)
step gemm_profile "$PY" bench/gemm_profile.py --device "$DEVICE" $GEMM_ARGS --out "$OUT/gemms.csv" --force
step gemm_calibrate "$PY" -m solm calibrate "$OUT/gemms.csv" --hardware "$HARDWARE" \
  --out "$OUT/gemm-calibration.json" --force
step decode_efficiency "$PY" bench/decode_efficiency.py --arch "$ARCH" --device "$DEVICE" \
  --context "$CONTEXT" --passes "$PASSES"
for arch in "$ARCH" "$SMALL"; do
  for t in "$OUT/$arch"/*/; do
    [ -f "$t/requests.parquet" ] || continue
    sys=$(basename "$t")
    step "validate-$arch-$sys" "$PY" -m solm validate "$t"
    step "validate-uncal-$arch-$sys" "$PY" -m solm validate "$t" --uncalibrated
  done
done
echo "{\"bench\": \"gpu_run\", \"out\": \"$OUT\", \"device\": \"$DEVICE\", \"arch\": \"$ARCH\", \"ok\": $([ $status -eq 0 ] && echo true || echo false)}"
exit $status
