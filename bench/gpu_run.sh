#!/usr/bin/env bash
# The one prepared GPU run (issue 17, part 4-5), steps in this order: the part's own GEMM times
# (bench/gemm_profile.py) on an LLM grid and at token counts between the grid's, and the GEMM tile
# model calibrated on the grid (solm calibrate); every replayable system with structure replayed on
# a real-scale architecture (random weights, bf16), CUDA-event timing and NVML counters at 20 Hz
# (bench/gpu_capture.py); batch-1 decode bandwidth efficiency of the engine path, the static path
# and its torch.compile / CUDA-graph versions (bench/decode_efficiency.py); the same capture on the
# SmolLM2 architecture (arch:smollm2-135m: the 98 MB GGUF does not travel to the GPU machine);
# `solm validate` and `solm validate --uncalibrated` on every trace (VALIDATE=0 leaves them to the
# machine the traces come back to: they need no GPU); sequential serving under Poisson load beside
# a batch-1 calibration, and solm validate --calibrate-from on the load runs. Each step has its own
# time limit, and one failing step does not stop the others; everything lands under $OUT with a log
# per step. STEPS picks the steps (default all: gemm,capture,decode,small,serving,shapes); shapes:
# why some serving passes cost three times others (below).
#
#   GPU:        bash bench/gpu_run.sh       (OUT=out/gpu-run; on an H200 about 6 minutes: 243 s
#               without the serving step, which took 102 s; traces/gpu-h200 holds what it wrote;
#               the shapes step, added after, serves one load and runs the rows sweep per variant:
#               about 1 minute a variant. All steps and variants together outlast one 10-minute
#               device call: name STEPS and SHAPES_VARIANTS for the question at hand)
#   CPU check:  DEVICE=cpu ARCH=tiny-llama SMALL=tiny-qwen2 N=2 MAX_TOKENS=6 CONTEXT=32 PASSES=8 \
#               GEMM_ARGS="--m 1,8 --n 64,128 --k 64,128 --iters 2 --trials 2" BETWEEN_M=2,4 \
#               GEMM_BETWEEN_ARGS="--n 64 --k 64 --iters 2 --trials 2" SERVE_B1_N=4 SERVE_N=6 \
#               SERVE_RATES=20,80 SERVE_KV_MIB=8 \
#               OUT=/tmp/gpu-run-check bash bench/gpu_run.sh
set -u
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEVICE=${DEVICE:-cuda}
ARCH=${ARCH:-llama-3-8b}
SMALL=${SMALL:-smollm2-135m}
OUT=${OUT:-out/gpu-run}  # never the shipped traces/gpu-h200: every step replaces what it wrote there
N=${N:-4}
MAX_TOKENS=${MAX_TOKENS:-64}
CONTEXT=${CONTEXT:-512}
PASSES=${PASSES:-64}
STEP_LIMIT=${STEP_LIMIT:-240}
HARDWARE=${HARDWARE:-h200}  # the catalog part this machine is, for solm calibrate
GEMM_ARGS=${GEMM_ARGS:-}    # bench/gemm_profile.py grid flags (default: its LLM grid, 160 GEMMs)
BETWEEN_M=${BETWEEN_M:-2,4,8,24,32,48,96,192,320,384,448,640,768,896,1280,1536,1792,2560,3072,3584,5120,6144}
GEMM_BETWEEN_ARGS=${GEMM_BETWEEN_ARGS:-}  # e.g. --n/--k for the CPU check (default: the grid's (K, N) shapes)
VALIDATE=${VALIDATE:-1}     # 0: leave solm validate to the machine the traces are brought back to
STEPS=${STEPS:-gemm,capture,decode,small,serving,shapes}  # which steps run (a rerun can take fewer)
DECODE_ARGS=${DECODE_ARGS:-}  # more bench/decode_efficiency.py flags (e.g. --coordinate-descent --modes ...)
SERVE_B1_N=${SERVE_B1_N:-16}  # serving: batch-1 calibration requests (dev split), then under load
SERVE_N=${SERVE_N:-32}        # requests per load run (test split) at each of SERVE_RATES requests/s
SERVE_RATES=${SERVE_RATES:-4,16,64}
SERVE_KV_MIB=${SERVE_KV_MIB:-512}  # the load runs' KV pool (the capture's 8 MiB default holds 64 tokens of an 8B)
SHAPES_RATE=${SHAPES_RATE:-64}     # shapes: the load of every variant (64 req/s had the most slow passes)
SWEEP_PROFILE_A=${SWEEP_PROFILE_A:-5x384}  # shapes: two (rows x slots) shapes the rows sweep does not run,
SWEEP_PROFILE_B=${SWEEP_PROFILE_B:-7x200}  # each profiled on its first and second pass
SWEEP_REPS=${SWEEP_REPS:-5}                # shapes: the rows sweep's timed passes per shape
SHAPES_VARIANTS=${SHAPES_VARIANTS:-auto,expandable,gather,no-cudnn,bucket,efficient}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
status=0
want() { [[ ",$STEPS," == *",$1,"* ]]; }
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
# the part's own GEMM times first (the cheapest step, and data no fit has seen), each with the
# kernels cuBLAS ran for it (--kernels: its tile and split-K choice by name, what the A100 data
# could not show and what the tile model's errors at 64-1024 tokens come down to): the default grid,
# then the same (K, N) shapes at token counts between the grid's (a held-out set for solm calibrate's
# fit and for the carried A100 fit); the tile model calibrated on the grid (docs/cost_model.md)
if want gemm; then
  step gemm_profile "$PY" bench/gemm_profile.py --device "$DEVICE" $GEMM_ARGS --kernels --out "$OUT/gemms.csv" --force
  step gemm_profile_between "$PY" bench/gemm_profile.py --device "$DEVICE" --m "$BETWEEN_M" $GEMM_BETWEEN_ARGS \
    --kernels --out "$OUT/gemms-between.csv" --force
  step gemm_calibrate "$PY" -m solm calibrate "$OUT/gemms.csv" --hardware "$HARDWARE" \
    --out "$OUT/gemm-calibration.json" --force
fi
want capture && step "capture-$ARCH" "$PY" bench/gpu_capture.py --arch "$ARCH" --device "$DEVICE" --n "$N" \
  --max-tokens "$MAX_TOKENS" --counters-hz 20 --out "$OUT/$ARCH" --force
want decode && step decode_efficiency "$PY" bench/decode_efficiency.py --arch "$ARCH" --device "$DEVICE" \
  --context "$CONTEXT" --passes "$PASSES" $DECODE_ARGS
want small && step "capture-$SMALL" "$PY" bench/gpu_capture.py --arch "$SMALL" --device "$DEVICE" --n "$N" \
  --max-tokens "$MAX_TOKENS" --counters-hz 20 --out "$OUT/$SMALL" --force
# serving under load: sequential decoding of random weights runs every request to --max-tokens, so
# the batched runtime's passes are the measurement; solm validate --calibrate-from predicts each load
# run from the batch-1 capture alone (PASTA, TIP and Planned Diffusion need a replayed structure,
# which the load path does not take)
serve="$OUT/serving-$ARCH"
if want serving; then
  step serving-batch1 "$PY" -m solm capture --system sequential --model "arch:$ARCH" --device "$DEVICE" \
    --n "$SERVE_B1_N" --split dev --max-tokens "$MAX_TOKENS" --counters-hz 20 --out "$serve/batch1" --force --json
  for rate in ${SERVE_RATES//,/ }; do
    step "serving-rate-$rate" "$PY" -m solm capture --system sequential --model "arch:$ARCH" --device "$DEVICE" \
      --n "$SERVE_N" --split test --max-tokens "$MAX_TOKENS" --rate "$rate" --kv-budget-mib "$SERVE_KV_MIB" \
      --counters-hz 20 --out "$serve/rate-$rate" --force --json
  done
fi
# per-shape pass cost: on the H200 a serving pass took about 21 ms or about 60 ms at the same batch,
# the slow ones those meeting a (query rows, key span) pair for the first time (bench/pass_shapes.py,
# traces/gpu-h200/README.md; only passes of more than one row: a new span at one row cost nothing).
# Variants (SHAPES_VARIANTS), one after another on this machine: `auto`, PyTorch's own attention
# choice, as the runtime ran before runs 4-6 (mask attention over every slot handed out: the key
# span grows with the pool; on an H200, cuDNN's); `expandable`, the
# same with the CUDA caching allocator's expandable segments (if new shapes paid for cudaMalloc of
# new block sizes, this would remove most of it); `gather` attention (each request's own slots:
# the attention's shapes follow the requests, not the pool); and the attention strategies of
# runtime/attention.py (SOLM_SDPA): `no-cudnn`, `bucket` (rows and key span padded to powers of
# two: few shapes), `efficient`, `math`, `default` (the runtime's: `efficient` on a GPU). Per variant: the load served (pass_shapes prints new /
# seen per variant), and the rows sweep (runtime/rows_sweep.py: 50 shapes of 1-32 decode rows
# over pools of 64-1024 slots, each shape's first pass beside its median, `first_pass` in its
# JSON) with torch.profiler on the first and second pass of two shapes the sweep did not run
# (`profiles`: the operators the first pass spends its extra time in). Found by runs 4-6
# (traces/gpu-h200/README.md): cuDNN's attention builds a plan per new shape.
shapes="$OUT/shapes-$ARCH"
if want shapes; then
  compare=()
  for variant in ${SHAPES_VARIANTS//,/ }; do
    attention=mask; sdpa=auto; alloc=(env -u PYTORCH_CUDA_ALLOC_CONF)
    case $variant in
      gather) attention=gather ;;
      expandable) alloc=(env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
      auto) ;;
      *) sdpa=$variant ;;
    esac
    step "shapes-$variant" "${alloc[@]}" SOLM_SDPA="$sdpa" "$PY" -m solm capture --system sequential --model "arch:$ARCH" \
      --device "$DEVICE" --n "$SERVE_N" --split test --max-tokens "$MAX_TOKENS" --rate "$SHAPES_RATE" \
      --kv-budget-mib "$SERVE_KV_MIB" --attention "$attention" --counters-hz 20 --out "$shapes/$variant" --force --json
    step "sweep-$variant" "${alloc[@]}" SOLM_SDPA="$sdpa" "$PY" -m runtime.rows_sweep --model "arch:$ARCH" \
      --device "$DEVICE" --attention "$attention" --reps "$SWEEP_REPS" --profile "$SWEEP_PROFILE_A" \
      --profile "$SWEEP_PROFILE_B" --json
    compare+=("$shapes/$variant")
  done
  step shapes-compare "$PY" bench/pass_shapes.py "${compare[@]}"
fi
if [ "$VALIDATE" = 1 ] && [ -f "$serve/batch1/requests.parquet" ]; then
  step serving-validate "$PY" -m solm validate --calibrate-from "$serve/batch1" "$serve"/rate-*/
fi
for arch in "$ARCH" "$SMALL"; do
  [ "$VALIDATE" = 1 ] || break
  for t in "$OUT/$arch"/*/; do
    [ -f "$t/requests.parquet" ] || continue
    sys=$(basename "$t")
    step "validate-$arch-$sys" "$PY" -m solm validate "$t"
    step "validate-uncal-$arch-$sys" "$PY" -m solm validate "$t" --uncalibrated
  done
done
echo "{\"bench\": \"gpu_run\", \"out\": \"$OUT\", \"device\": \"$DEVICE\", \"arch\": \"$ARCH\", \"ok\": $([ $status -eq 0 ] && echo true || echo false)}"
exit $status
