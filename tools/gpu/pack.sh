#!/usr/bin/env bash
# Cut everything the lent H200 needs into the fewest parcels: MLX and its CUDA wheel, the
# pure-Python wheels the engine and tests need, and both real models (the default SmolLM2
# and Gemma 3 270M, ~350 MB) as one tar stream split into .device/p00.. (git-ignored).
# Each `run` may carry 64 MiB with the working tree (~20 MB, tests/oracles' fixtures), so a
# parcel is 46 MB: ten calls instead of restage.sh's six plus Gemma's six.
# Needs restage.sh's .device/g1-g3 (the wheels) and the models where the engine keeps them.
# On the H200, one `run` each, back to back, carry [".device/pNN"]:
#   all but the last: bash tools/gpu/unpack.sh .device/pNN      (keeps the parcel in /root/stash)
#   the last:         bash tools/gpu/unpack.sh .device/pNN && bash tools/gpu/device_all.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root/.device"
models=$(cd "$root" && .venv/bin/python -c 'from engine.model_catalog import models_dir; print(models_dir())')
rm -rf payload p[0-9][0-9] && mkdir -p payload/wheels payload/models
cat g1/cuda.00 g2/cuda.01 g3/cuda.02 > "payload/wheels/$(cat g3/wheel-name)"
cp g1/mlx-*.whl g3/wheels/*.whl payload/wheels/
cp "$models"/SmolLM2-135M-Instruct.Q4_1.gguf "$models"/gemma-3-270m-q4_k_m.* payload/models/
(cd payload && sha256sum wheels/* models/* > SHA256SUMS)
tar -cf - payload | split -b 46000000 -d - part.
for part in part.*; do mkdir "p${part#part.}" && mv "$part" "p${part#part.}/"; done
touch "$(ls -d p[0-9][0-9] | tail -1)/LAST"  # unpack.sh joins the stream when this comes
rm -rf payload
du -sh p[0-9][0-9]
