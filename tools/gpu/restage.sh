#!/usr/bin/env bash
# Re-cut the parcels of tools/gpu/stage.sh (.device/a..d) into six smaller ones,
# .device/g1..g6 (<= 36 MB each), for when the working tree that travels with every call
# has grown past ~3 MB (tests/oracles' fixtures: ~18 MB) and a..d no longer fit beside it.
# On the H200, one `run` each, back to back, carry [".device/gN"]:
#   g1-g5: bash tools/gpu/stash.sh .device/gN      (g3 also installs MLX and the wheels)
#   g6:    bash tools/gpu/device_suite.sh           (joins the model; .device/g6 holds model.03)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)/.device"
rm -rf g1 g2 g3 g4 g5 g6 parts
mkdir -p g1 g2 g3 g4 g5 g6 parts
cat a/part.aa b/part.ab > "parts/$(cat b/wheel-name)"
(cd parts && split -b 30M -d "$(cat ../b/wheel-name)" cuda.)
cp a/mlx-*.whl g1/ && mv parts/cuda.00 g1/
mv parts/cuda.01 g2/
mv parts/cuda.02 g3/ && cp -r c/wheels g3/ && cp b/wheel-name g3/
cp a/model.00 b/model.01 g4/
cp c/model.02 g5/
cp d/model.03 d/model.sha256 g6/
rm -rf parts
du -sh g*
