#!/usr/bin/env bash
# The step kernel's build knobs timed on the H200 (bench/gpu/step_tuning.py), after
# tools/gpu/unpack.sh's last parcel: the default model, then random Q4_K_M weights in the
# shapes of Llama-3.2-1B and Llama-3.1-8B, each configuration's decode and 8-row verify at
# 128 and 2,048 tokens, with its logits checked against the engine's build bit for bit.
# $OUT gets one JSON a model. Usage: bash tools/gpu/tuning_round.sh [configs]
# (slices:stream:rows[:blocks:smem:verify_blocks:barrier:l1:kfactors],..., default step_tuning.py's
# DEFAULT_CONFIGS). MODELS="default llama-3.1-8b" picks the models (each ~10 s a
# configuration and context: split the three over calls of under 600 s); PROBE=1 also
# times each phase of the engine's build on every model (bench/gpu/step_probe.py --model).
# A configuration of the other table layout (kfactors, FQ_KFACTORS) loads the model a second
# time with it and runs beside the engine's, against the same reference logits.
set -u
export PYTHONPATH=/root/site:$PWD
configs=${1:-}
mkdir -p /root/shapes
for model in ${MODELS:-default llama-3.2-1b llama-3.1-8b}; do
  path=""
  if [ "$model" != default ]; then
    python3 -m bench shapes write --shape "$model" --out /root/shapes > /dev/null || continue
    path="--model /root/shapes/$model.gguf"
  fi
  timeout "${MODEL_TIMEOUT:-180}" python3 -m bench.gpu.step_tuning $path \
    ${configs:+--configs "$configs"} --out "$OUT/tuning-$model.json" 2>&1 \
    | grep -v "^ " | cut -c1-220
  echo "== $model: exit ${PIPESTATUS[0]}"
  if [ -n "${PROBE:-}" ]; then
    timeout "${MODEL_TIMEOUT:-180}" python3 -m bench.gpu.step_probe ${path:-} --prefetch 0 \
      > "$OUT/step-probe-$model.txt" 2>&1
    echo "== $model probe: exit $?"
  fi
  rm -f "/root/shapes/$model.gguf"
done
