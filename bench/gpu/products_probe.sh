#!/usr/bin/env bash
# bench/gpu/products_probe.cu built and run for each variant of the step's dot products: the
# engine's large-layer step (8 slices of 4 bytes a lane, words decoded as used, two blocks an
# SM), its staged x swizzled, and FQ_WIDE's 32 weights a lane at 2, 4 and 8 slices a load.
# Needs nvcc and a GPU, nothing else (no MLX). One JSON line a matrix, a file a variant:
#   bash bench/gpu/products_probe.sh [OUT_DIR]      (default $OUT, else /tmp)
set -u
out=${1:-${OUT:-/tmp}}
export PATH=/usr/local/cuda/bin:$PATH
variants=(
  "narrow:-DFQ_STREAM=1"
  "swizzle:-DFQ_STREAM=1 -DFQ_SWIZZLE=1"
  "wide2:-DFQ_STREAM=1 -DFQ_SWIZZLE=1 -DFQ_WIDE=2048 -DFQ_WIDE_SLICES=2"
  "wide4:-DFQ_STREAM=1 -DFQ_SWIZZLE=1 -DFQ_WIDE=2048 -DFQ_WIDE_SLICES=4"
  "wide8:-DFQ_STREAM=1 -DFQ_SWIZZLE=1 -DFQ_WIDE=2048 -DFQ_WIDE_SLICES=8"
  "wide4-noswizzle:-DFQ_STREAM=1 -DFQ_WIDE=2048 -DFQ_WIDE_SLICES=4"
  "narrow-again:-DFQ_STREAM=1"
)
for v in "${variants[@]}"; do
  name=${v%%:*}
  nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda ${v#*:} bench/gpu/products_probe.cu \
    -o "/tmp/products-$name" > "/tmp/products-$name.build" 2>&1 &
done
wait
for v in "${variants[@]}"; do
  name=${v%%:*}
  [ -x "/tmp/products-$name" ] || { echo "== $name: build failed"; tail -3 "/tmp/products-$name.build"; continue; }
  timeout 120 "/tmp/products-$name" > "$out/products-$name.txt" 2>&1
  echo "== $name: exit $?"
  python3 - "$out/products-$name.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{"matrix"'):
        r = json.loads(line)
        print(f'  {r["matrix"]:12s} {r["median_us"]:8.1f} us {r["tb_s"]:6.2f} TB/s  y0 {r["y0"]:.6g}')
    elif not line.startswith("{"):
        print(" ", line.rstrip())
PY
done
