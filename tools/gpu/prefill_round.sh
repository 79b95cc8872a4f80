#!/usr/bin/env bash
# Issue 15's prefill round on the H200, after tools/gpu/unpack.sh's last parcel, carrying
# .device/llama too: llama.cpp's CUDA build runs in the background (niced, so the probes'
# Python keeps a core), and meanwhile the prefill probe (MLX's quantized product of float32
# rows against rows rounded to bfloat16, each layer started as it is built or not, in
# 2,048-row chunks) and the forward probe with each product. $OUT gets their JSON and logs.
# Then `bash tools/gpu/llama_cuda.sh bench` has its llama-bench.
set -u
export PYTHONPATH=/root/site:$PWD
(
  nice -n 19 bash tools/gpu/llama_cuda.sh build > "$OUT/llama-build.txt" 2>&1
  echo "build exit $?" >> "$OUT/llama-build.txt"
) &
python3 -m bench.gpu.prefill_probe --modes quantized,quantized16 --chunks 2048 \
  --contexts 128,512,1024,2048 --overlap off,on --out "$OUT/prefill-probe.json" \
  > "$OUT/prefill-probe.txt" 2>&1
grep -v '^ \|^{\|^}' "$OUT/prefill-probe.txt"
for matmul in quantized quantized16; do
  BRANCHCHAT_GPU_MATMUL=$matmul python3 -m bench.gpu.forward_probe \
    --out "$OUT/forward-probe-$matmul.json" > "$OUT/forward-probe-$matmul.txt" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], \
    d['forward_ms'], d['pipelined_forward_ms'])" "$OUT/forward-probe-$matmul.json" $matmul
done
wait
tail -2 "$OUT/llama-build.txt"
