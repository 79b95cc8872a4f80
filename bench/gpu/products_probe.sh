#!/usr/bin/env bash
# bench/gpu/products_probe.cu built and run for each variant of the step's dot products: the
# engine's large-layer step (8 slices of 4 bytes a lane, words decoded as used, two blocks an
# SM), its staged x swizzled, FQ_WIDE's 32 weights a lane at 2, 4 and 8 slices a load, then
# x in int8 (PROBE_INT8: 1 the engine's fq_stage_i8 and fq_dot_i8, 2 with 32 weights a lane).
# Needs nvcc and a GPU, nothing else (no MLX). One JSON line a matrix, a file a variant;
# ONLY="narrow i8w" runs the variants named.
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
  "i8n:-DPROBE_INT8=1"
  "i8n-4blocks:-DPROBE_INT8=1 -DBLOCKS=4"
  "i8w:-DPROBE_INT8=2"
  "i8w-3blocks:-DPROBE_INT8=2 -DBLOCKS=3"
  "i8w-4slices:-DPROBE_INT8=2 -DI8_WIDE_SLICES=4"
  "narrow-8rows:-DFQ_STREAM=1 -DPROBE_ROWS=8"
  "i8n-8rows:-DPROBE_INT8=1 -DPROBE_ROWS=8"
  "i8w-8rows:-DPROBE_INT8=2 -DPROBE_ROWS=8"
  "narrow-again:-DFQ_STREAM=1"
)
source bench/gpu/only_variants.sh
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
        print(f'  {r["matrix"]:12s} {r["median_us"]:8.1f} us {r["tb_s"]:6.2f} TB/s  '
              f'y0 {r["y0"]:.6g} err {r["rel_err"]:.2g}')
    elif not line.startswith("{"):
        print(" ", line.rstrip())
PY
done
