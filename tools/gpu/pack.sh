#!/usr/bin/env bash
# Cut everything the lent H200 needs into the fewest parcels: MLX and its CUDA wheel, the
# pure-Python wheels the engine and tests need, and both real models (the default SmolLM2
# and Gemma 3 270M, ~350 MB) as one tar stream split into .device/p00.. (git-ignored).
# Each `run` may carry 64 MiB with the working tree, so a parcel is what the tree leaves less
# 4 MB (the tree was 20 MB when this was written and 41.5 MB on 2026-12-07, when ~470 MB went
# in 22 parcels of 21 MB).
# Needs restage.sh's .device/g1-g3 (the wheels) and the models where the engine keeps them.
# PACK_MODELS=smollm2 packs the default model alone (the drafter's session: 6 parcels),
# PACK_MODELS=none no model (tests of the tiny models only: 4 parcels of 26 MB);
# PARCEL_BYTES sets the parcel size (the tree plus one parcel must stay under 64 MiB): with
# `PARCEL_BYTES=$(bash tools/gpu/slim_tree.sh size)`, 58 MB, for staging calls made with
# `slim_tree.sh on` (and `off` before the first call that tests or times).
# On the H200, one `run` each, back to back, carry [".device/pNN"]:
#   all but the last: bash tools/gpu/unpack.sh .device/pNN      (keeps the parcel in /root/stash)
#   the last:         bash tools/gpu/unpack.sh .device/pNN && bash tools/gpu/device_all.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
tree_bytes=$(cd "$root" && git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
parcel_bytes=${PARCEL_BYTES:-$(( (64 << 20) - tree_bytes - (4 << 20) ))}
cd "$root/.device"
models=$(cd "$root" && .venv/bin/python -c 'from engine.model_catalog import models_dir; print(models_dir())')
rm -rf payload p[0-9][0-9] && mkdir -p payload/wheels payload/models
cat g1/cuda.00 g2/cuda.01 g3/cuda.02 > "payload/wheels/$(cat g3/wheel-name)"
cp g1/mlx-*.whl g3/wheels/*.whl payload/wheels/
# the remote client's (tests/engine/remote): openai 3 on httpx2, pydantic and theirs; and
# grimp, which tests/tools' import-cycle check reads
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d payload/wheels openai==3.57.0 httpx2==2.16.2 \
  httpcore2==2.16.2 pydantic==2.14.4 pydantic_core==2.50.5 jiter==0.19.0 \
  typing-inspection==0.4.5 annotated-types==0.8.0 sniffio==1.3.1 distro==1.9.0 \
  truststore==0.10.5 typing_extensions==4.16.0 anyio==4.16.0 idna==3.20 h11==0.16.0 \
  grimp==3.20 2>&1 \
  | { grep -v WARN || true; }
[ "${PACK_MODELS:-all}" = none ] || cp "$models"/SmolLM2-135M-Instruct.Q4_1.gguf payload/models/
[ "${PACK_MODELS:-all}" != all ] || cp "$models"/gemma-3-270m-q4_k_m.* payload/models/
(cd payload && find wheels models -type f -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
tar -cf - payload | split -b "$parcel_bytes" -d - part.
for part in part.*; do mkdir "p${part#part.}" && mv "$part" "p${part#part.}/"; done
touch "$(ls -d p[0-9][0-9] | tail -1)/LAST"  # unpack.sh joins the stream when this comes
rm -rf payload
du -sh p[0-9][0-9]
