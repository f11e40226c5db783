#!/usr/bin/env bash
# Measure one CUDA GPU's kernel ceilings with `paraplan bench`, for `paraplan fit --kind kernels`:
#   gemm_bf16/gemm.csv         BF16 GEMMs: an 11^3 grid (m, n, k 256-16384) and the forward, dgrad and
#                              wgrad GEMMs of GPT-3 175B, Llama 3 8B/70B/405B layers at their usual TP
#   attn_cudnn, attn_flash     causal attention forward/backward (SDPA's cuDNN and FlashAttention-2
#                              kernels), BF16, head dims 64 and 128, 16 heads, s 512-32768
#   sustained_bf16             8192^3 BF16 GEMMs back to back for 30 s: burst and sustained rate, clock, power
#   gemm_fp8, sustained_fp8    the same for FP8 (torch._scaled_mm, per-tensor scales)
#   profile.tgz                `paraplan profile` of a 4-layer GPT (h 4096) on the GPU, BF16
# Usage (repository root, a CUDA machine with torch, numpy, pandas, pyyaml, tqdm):
#   OUT=results/kernels/my-gpu bash benchmarks/gpu/measure_kernels.sh
#   HELD_ONLY=1 [HOLD_S=0.3] [MIN_TIME_S=0.5] OUT=results/kernels/my-gpu-held bash benchmarks/gpu/measure_kernels.sh
#     (the held pass: every shape timed at the power limit; about 9 min on an H100 with the 0.5 s window)
#   MOE_ONLY=1 [GROUPED_MAX_S=150] [HOLD_S=0.2] [MIN_TIME_S=0.3] OUT=results/kernels/my-gpu-moe bash benchmarks/gpu/measure_kernels.sh
#     (a MoE layer's expert GEMMs, BF16 and FP8, benchmarks/gpu/grouped_gemm.py; then the FP8 grid held, timed over
#     a window, with and without fast accumulation)
# Then: paraplan fit --kind kernels ... (docs/kernels.md, "Measuring a GPU").
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/measure.log"
{ date -u; nvidia-smi; nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())'; } >"$LOG" 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU" in
  *H100*80GB*HBM3*) NAME=H100-SXM5-80GB ;;
  *H200*) NAME=H200-SXM-141GB ;;
  *A100*SXM4*80GB*) NAME=A100-SXM4-80GB ;;
  *) NAME=${DEVICE_NAME:-$GPU} ;;
esac
echo "device: $GPU -> $NAME" | tee -a "$LOG"
SHAPES=$($PY - <<'PY'
sizes = [256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
shapes = {(m, n, k) for m in sizes for n in sizes for k in sizes}
layers = {  # (n, k) of the forward GEMMs of a layer at TP t: qkv, proj, fc1, fc2
    "gpt3-175b tp8": [(4608, 12288), (12288, 1536), (6144, 12288), (12288, 6144)],
    "llama3-8b tp1": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "llama3-70b tp8": [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)],
    "llama3-405b tp8": [(2304, 16384), (16384, 2048), (13312, 16384), (16384, 6656)],
}
for pairs in layers.values():
    for m in (2048, 4096, 8192, 16384):
        for n, k in pairs:
            shapes |= {(m, n, k), (m, k, n), (k, n, m)}  # forward, dgrad, wgrad
print(",".join(f"{m}x{n}x{k}" for m, n, k in sorted(shapes)))
PY
)
FP8=$($PY -c 'import itertools as i; s=(1024,2048,4096,8192,16384); print(",".join(f"{m}x{n}x{k}" for m,n,k in i.product(s,s,s)))')
run() { echo "== $*" >>"$LOG"; "$PY" -m paraplan bench --no-track --device cuda --device-name "$NAME" "$@" 2>>"$LOG" || echo "FAILED: $*" | tee -a "$LOG"; }
HELD=$($PY - "$SHAPES" <<'PY'
import sys
big = [s for s in sys.argv[1].split(",") if all(int(d) >= 1024 for d in s.split("x"))]
grid = {f"{m}x{n}x{k}" for m in (1024, 2048, 4096, 8192, 16384) for n in (1024, 2048, 4096, 8192, 16384)
        for k in (1024, 2048, 4096, 8192, 16384)}
train = [s for s in big if any(int(d) not in (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
                               for d in s.split("x"))]
print(",".join(sorted(grid | set(train))))
PY
)
if [ "${MOE_ONLY:-0}" = 1 ]; then
  # a MoE layer's expert GEMMs (benchmarks/gpu/grouped_gemm.py: per-expert GEMMs on 1 and 4 streams, one grouped
  # kernel, the dense GEMM of the same FLOPs), BF16 and FP8; then the FP8 grid held (HOLD_S) and timed over a
  # window (MIN_TIME_S), with and without fast accumulation
  for dtype in bfloat16 float8_e4m3fn; do
    echo "== grouped_gemm.py --dtype $dtype" >>"$LOG"
    "$PY" benchmarks/gpu/grouped_gemm.py --dtype $dtype --max-s "${GROUPED_MAX_S:-150}" \
      --out "$OUT/grouped_gemm_${dtype%%_*}.csv" 2>>"$LOG" || echo "FAILED: grouped_gemm $dtype" | tee -a "$LOG"
  done
  HOLD=${HOLD_S:-0.2}
  WINDOW=${MIN_TIME_S:-0.3}
  run --kind gemm --dtype float8_e4m3fn --gemm-shapes "$FP8" --hold-s "$HOLD" --min-time-s "$WINDOW" \
    -o "$OUT/gemm_fp8_held"
  run --kind gemm --dtype float8_e4m3fn --fp8-fast-accum --gemm-shapes "$FP8" --hold-s "$HOLD" \
    --min-time-s "$WINDOW" -o "$OUT/gemm_fp8_fast_held"
  { date -u; nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE; } >>"$LOG" 2>&1
  grep -h "paraplan bench:\|FAILED\|grouped_gemm.py\|: [0-9]* s$" "$LOG"
  exit 0
fi
if [ "${HELD_ONLY:-0}" = 1 ]; then
  # each shape run back to back for HOLD_S seconds before it is timed (at the clock the GPU holds at its power
  # limit), then timed until its calls add up to MIN_TIME_S (a window spanning the power controller's clock
  # swings; data/measured/h100-sxm5 was taken with MIN_TIME_S=0, 20 calls a shape)
  HOLD=${HOLD_S:-0.3}
  WINDOW=${MIN_TIME_S:-0.5}
  run --kind gemm --dtype bfloat16 --gemm-shapes "$HELD" --hold-s "$HOLD" --min-time-s "$WINDOW" -o "$OUT/gemm_bf16_held"
  for backend in cudnn flash; do
    run --kind attention --dtype bfloat16 --sdpa-backend $backend --seq-lengths 512,1024,2048,4096,8192,16384,32768 \
      --head-dims 64,128 --heads 16 --tokens 32768 --hold-s "$HOLD" --min-time-s "$WINDOW" -o "$OUT/attn_${backend}_held"
  done
  run --kind gemm --dtype float8_e4m3fn --gemm-shapes "$FP8" --hold-s "$HOLD" --min-time-s "$WINDOW" \
    -o "$OUT/gemm_fp8_held"
  run --kind gemm --dtype float8_e4m3fn --fp8-fast-accum --gemm-shapes "$FP8" --hold-s "$HOLD" \
    --min-time-s "$WINDOW" -o "$OUT/gemm_fp8_fast_held"
  run --kind gemm-sustained --dtype bfloat16 --gemm-shapes 8192x13312x16384 --sustain-s 20 -o "$OUT/sustained_bf16_b"
  { date -u; nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE; } >>"$LOG" 2>&1
  grep -h "paraplan bench:\|FAILED" "$LOG"
  exit 0
fi
run --kind gemm --dtype bfloat16 --gemm-shapes "$SHAPES" -o "$OUT/gemm_bf16"
for backend in cudnn flash; do
  run --kind attention --dtype bfloat16 --sdpa-backend $backend --seq-lengths 512,1024,2048,4096,8192,16384,32768 \
    --head-dims 64,128 --heads 16 --tokens 32768 -o "$OUT/attn_$backend"
done
run --kind gemm-sustained --dtype bfloat16 --gemm-shapes 8192x8192x8192 --sustain-s 30 -o "$OUT/sustained_bf16"
run --kind gemm --dtype float8_e4m3fn --gemm-shapes "$FP8" -o "$OUT/gemm_fp8"
run --kind gemm-sustained --dtype float8_e4m3fn --gemm-shapes 8192x8192x8192 --sustain-s 20 -o "$OUT/sustained_fp8"
echo "== profile (the torch measurement path on CUDA)" >>"$LOG"
"$PY" -m paraplan profile --no-track --model gpt --device cuda --dtype bfloat16 --hidden-size 4096 \
  --num-attention-heads 32 --seq-length 2048 --num-layers 4 --profile-batch-size 4 -o "$OUT/profile/gpt.csv" 2>>"$LOG" \
  && tar czf "$OUT/profile.tgz" -C "$OUT" profile && rm -r "$OUT/profile" || echo "FAILED: profile" | tee -a "$LOG"
{ date -u; nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE; } >>"$LOG" 2>&1
grep -h "paraplan bench:\|FAILED" "$LOG"
