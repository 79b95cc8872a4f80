#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel, the default model joined): each
# phase's x staged by asynchronous copies (FQ_STAGE_ASYNC, kernels/cuda/fused_step.cuh's
# fq_stage) beside the engine's build. Session 26's H200 phases grew with a verify's rows
# as the staging's serial L2 trips do (one a 1,024 floats: down at 8 rows, 12 of them).
# PART=a: the fused tests of every layer kind with the knob on (rows bit-identical to single
# steps, each knob's rows equal to the engine build's), then both builds timed on the
# default model, their logits checked bit for bit against the engine build's; PART=b: the
# phases stamped with the knob on, a step and verifies of 2 / 4 / 8 / 16 rows, and greedy
# speculation with it on and off. $OUT gets the logs.
#     PART=a bash tools/gpu/stage_round.sh; PART=b bash tools/gpu/stage_round.sh
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
if [ "${PART:-a}" = a ]; then
  BRANCHCHAT_STEP_TUNING=FQ_STAGE_ASYNC=1 timeout -s INT "${TEST_BUDGET:-200}" python3 -m pytest \
    -q -p no:cacheprovider -rfE tests/engine/test_fused_decode.py tests/engine/test_fused_hybrid.py \
    tests/engine/test_fused_gemma3.py -k "bit_identical or STAGE" > "$out/stage-tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$out/stage-tests.txt" | cut -c1-300
  tail -1 "$out/stage-tests.txt"
  timeout 240 python3 -m bench.gpu.step_tuning --model "$gguf" --contexts 128 512 2048 \
    --configs 8:0:4:1:16384,8:0:4:1:16384:0:0:0:0:1:1 \
    --out "$out/stage-tuning.json" > "$out/stage-tuning.log" 2>&1
  cut -c1-400 "$out/stage-tuning.log"
else
  BRANCHCHAT_STEP_TUNING=FQ_STAGE_ASYNC=1 timeout 150 python3 -m bench.gpu.step_probe \
    --model "$gguf" --contexts 512 2048 --prefetch 1 --rows 1 2 4 8 16 > "$out/stage-phases-1.json" 2>&1
  cut -c1-600 "$out/stage-phases-1.json"
  knob_speculation FQ_STAGE_ASYNC chat,regenerate,code stage 1 0
fi
