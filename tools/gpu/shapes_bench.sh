#!/usr/bin/env bash
# Issue 15, item 6, on the H200 after tools/gpu/unpack.sh's last parcel and
# `tools/gpu/llama_cuda.sh build`: each true shape of `python -m bench shapes` written to
# /root/shapes (random Q4_K_M blocks: ~20 s for the 8B on two cores, faster there), then
# the decode bench on it beside llama.cpp's CUDA llama-bench and mlx-lm, with each decode
# figure as a share of the H200's bandwidth (bench/roofline.py). A shape's file is deleted
# after its bench (the 8B is 4.9 GB). $OUT/shapes gets a log and the JSON per shape.
# Usage: bash tools/gpu/shapes_bench.sh [shape ...]   (default: the four true shapes)
# RUNS (default 2), SHAPE_TIMEOUT (seconds a shape's bench may take, default 240) and
# CONTEXTS (default 128,512,1024,2048,8192).
set -u
export PYTHONPATH=/root/site:$PWD
shapes=${*:-qwen3.5-0.8b llama-3.2-1b qwen3-4b llama-3.1-8b}
mkdir -p /root/shapes "$OUT/shapes"
for shape in $shapes; do
  python3 -m bench shapes write --shape "$shape" --out /root/shapes || continue
  rm -f results/decode-*.json
  timeout "${SHAPE_TIMEOUT:-240}" python3 -m bench decode --model "/root/shapes/$shape.gguf" \
    --peers --runs "${RUNS:-2}" --steps 32 --contexts "${CONTEXTS:-128,512,1024,2048,8192}" \
    --llama-bench /root/llama.cpp/build/bin/llama-bench > "$OUT/shapes/$shape.txt" 2>&1
  echo "== $shape: exit $?"; tail -25 "$OUT/shapes/$shape.txt"
  cp results/decode-*.json "$OUT/shapes/$shape.json" 2>/dev/null
  rm -f "/root/shapes/$shape.gguf"
done
