#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel, the default model joined): a
# row's attention chunks combined as o_proj stages its x (FQ_LATE_COMBINE) and the verify
# build at two blocks an SM (FQ_VERIFY_BLOCKS=2) beside the engine's build. PART=a: the
# fused tests of every layer kind (rows bit-identical to single steps, each knob's rows
# equal to the engine build's), then the builds timed on the default model with their
# logits checked bit for bit against the engine build's; PART=b: the phases stamped with
# the late combine on and off, a step and an 8-row verify. $OUT gets the logs.
#     PART=a bash tools/gpu/combine_round.sh; PART=b bash tools/gpu/combine_round.sh
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
if [ "${PART:-a}" = a ]; then
  timeout -s INT "${TEST_BUDGET:-200}" python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/engine/test_fused_decode.py tests/engine/test_fused_hybrid.py \
    tests/engine/test_fused_gemma3.py > "$out/combine-tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$out/combine-tests.txt" | cut -c1-300
  tail -2 "$out/combine-tests.txt"
  timeout 300 python3 -m bench.gpu.step_tuning --model "$gguf" --contexts 128 512 2048 \
    --configs 8:0:4:1:16384,8:0:4:1:16384:0:0:0:0:1:1,8:0:4:1:16384:2 \
    --out "$out/combine-tuning.json" > "$out/combine-tuning.log" 2>&1
  cut -c1-400 "$out/combine-tuning.log"
else
  for late in 1 0; do
    BRANCHCHAT_STEP_TUNING=FQ_LATE_COMBINE=$late timeout 200 python3 -m bench.gpu.step_probe \
      --model "$gguf" --contexts 512 2048 --prefetch 1 --rows 1 8 > "$out/combine-phases-$late.json" 2>&1
    cut -c1-600 "$out/combine-phases-$late.json"
  done
fi
