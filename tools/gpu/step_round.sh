#!/usr/bin/env bash
# The weight table's round on the H200 (issue 15), after tools/gpu/unpack.sh's last parcel,
# carrying .device/llama too: llama.cpp's CUDA build in the background (niced), and
# meanwhile the one-launch step's tests (the table read back, the sources compiled by the
# device's nvcc, the fused path against the plain forward in float32 and bfloat16, rows of
# a verify against single steps bit for bit) and the France prompt. $OUT gets the logs.
# Then `bash tools/gpu/llama_cuda.sh bench` and tools/gpu/shapes_bench.sh have their peer.
set -u
export PYTHONPATH=/root/site:$PWD
if [ -d .device/llama ] && [ ! -x /root/llama.cpp/build/bin/llama-bench ]; then
  (
    nice -n 19 bash tools/gpu/llama_cuda.sh build > "$OUT/llama-build.txt" 2>&1
    echo "build exit $?" >> "$OUT/llama-build.txt"
  ) &
fi
timeout -s INT "${TEST_BUDGET:-360}" python3 -m pytest -q -p no:cacheprovider -rfE \
  --durations=5 tests/kernels/test_step_weights.py tests/kernels/test_fused_step_source.py \
  tests/engine/test_fused_decode.py > "$OUT/step-tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/step-tests.txt" | cut -c1-300
tail -12 "$OUT/step-tests.txt"
python3 -m engine generate --prompt "What is the capital of France?" --temperature 0 \
  > "$OUT/france.txt" 2>&1
tail -3 "$OUT/france.txt"
wait
tail -2 "$OUT/llama-build.txt" 2>/dev/null
