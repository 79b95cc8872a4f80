#!/usr/bin/env bash
# Prepare everything the lent H200 machine needs, in four parcels under .device/
# (git-ignored), each under the 64 MiB that one `run` call may carry:
#   a: MLX wheel + first half of mlx-cuda-13 + model part 1   -> step 1: stash
#   b: second half of mlx-cuda-13 + model part 2              -> step 2: install MLX
#   c: model part 3 + pure-Python wheels the engine needs     -> step 3: GPU tests, rollback bench
#   d: model part 4                                           -> step 4: join model, benches
# Run from the project root with the default model fetched (make model), naming the
# workplace's script that stages MLX's CUDA wheel into .device/a and .device/b:
#   bash tools/gpu/stage.sh PATH/TO/stage-mlx-cuda.sh
set -euo pipefail
stager=$(realpath "${1:?usage: tools/gpu/stage.sh PATH/TO/stage-mlx-cuda.sh}")
root=$(git rev-parse --show-toplevel)
cd "$root"
bash "$stager"
model=$(.venv/bin/python -c 'from engine.default_model import default_model_path as p; print(p())')
mkdir -p .device/c .device/d .device/parts
split -b 15M -d "$model" .device/parts/model.
mv .device/parts/model.00 .device/a/
mv .device/parts/model.01 .device/b/
cat .device/parts/model.02 .device/parts/model.03 > .device/c/model.02
cat .device/parts/model.0[4-9] > .device/d/model.03
rm -rf .device/parts
sha256sum "$model" | cut -d' ' -f1 > .device/d/model.sha256
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_35_x86_64 -d .device/c/wheels \
  platformdirs gguf pytest hypothesis pluggy iniconfig sortedcontainers attrs "mlx-lm==0.32.2" 2>/dev/null
cp tools/gpu/device_*.sh .device/c/ 2>/dev/null || true
du -sh .device/*
