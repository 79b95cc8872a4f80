#!/usr/bin/env bash
# On the lent GPU (MLX unpacked by tools/gpu/unpack.sh, the default model joined): a
# verify's groups of rows spread over the warps (FQ_SPREAD, kernels/cuda/fused_step.cuh's
# FqUnits) beside the engine's build. The fused tests of every layer kind with the knob on
# (rows bit-identical to single steps), the builds' decode and 8-row verify timed on the
# default model with their logits checked against the engine build's bits, the verify
# curve stamped at 1..16 rows with the knob on and off, and speculation (regenerate, code:
# where verifies of many rows are taken) with it on and off. $OUT gets the logs.
#     bash tools/gpu/spread_round.sh
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
BRANCHCHAT_STEP_TUNING=FQ_SPREAD=1 timeout -s INT "${TEST_BUDGET:-120}" python3 -m pytest -q \
  -p no:cacheprovider -rfE tests/engine/test_fused_decode.py tests/engine/test_fused_hybrid.py \
  tests/engine/test_fused_gemma3.py > "$out/spread-tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$out/spread-tests.txt" | cut -c1-300
tail -2 "$out/spread-tests.txt"
timeout 150 python3 -m bench.gpu.step_tuning --model "$gguf" --contexts 128 2048 \
  --configs 8:0:4:1:16384,8:0:4:1:16384:0:0:0:0:0,8:0:4:1:16384:2,8:0:2:1:8192:2 \
  --out "$out/spread-tuning.json" > "$out/spread-tuning.log" 2>&1
cut -c1-400 "$out/spread-tuning.log"
for s in 0 1; do
  BRANCHCHAT_STEP_TUNING=FQ_SPREAD=$s timeout 90 python3 -m bench.gpu.step_probe --model "$gguf" \
    --contexts 512 --prefetch 1 --rows 1 2 4 8 16 > "$out/spread-phases-$s.json" 2>&1
  cut -c1-500 "$out/spread-phases-$s.json"
done
knob_speculation FQ_SPREAD regenerate,code spread 0 1
