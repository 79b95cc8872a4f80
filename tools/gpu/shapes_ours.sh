#!/usr/bin/env bash
# The decode bench of ours alone on true shapes (no peers: a round short of device time,
# the peers' figures then come from tools/gpu/shapes_bench.sh's latest run on this kind
# of machine), after tools/gpu/unpack.sh's last parcel. $OUT/shapes gets a log and the
# JSON per shape. Usage: bash tools/gpu/shapes_ours.sh [shape ...] (default: the 1B, the
# 8B and Qwen3-4B); SHAPE_TIMEOUT (seconds a shape may take, default 150).
set -u
export PYTHONPATH=/root/site:$PWD
shapes=${*:-llama-3.2-1b llama-3.1-8b qwen3-4b}
mkdir -p /root/shapes "$OUT/shapes"
for shape in $shapes; do
  python3 -m bench shapes write --shape "$shape" --out /root/shapes > /dev/null || continue
  rm -f results/decode-*.json
  timeout "${SHAPE_TIMEOUT:-150}" python3 -m bench decode --model "/root/shapes/$shape.gguf" \
    --runs 1 --steps 32 --contexts 128,2048,8192 > "$OUT/shapes/$shape.txt" 2>&1
  echo "== $shape: exit $?"
  grep -E "^context|^verify" "$OUT/shapes/$shape.txt"
  cp results/decode-*.json "$OUT/shapes/$shape.json" 2>/dev/null
  rm -f "/root/shapes/$shape.gguf"
done
