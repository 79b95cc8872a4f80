#!/usr/bin/env bash
# Here (not on the H200): cut the default model into parts small enough to travel beside
# the working tree (a call carries 64 MiB in all, the tracked tree ~39 MB of it), under
# .device/drafter/p1..pN (git-ignored), with its sha256 in the last part.
#
#   bash tools/drafter/stage_model.sh [GGUF] [PART_MB]      (defaults: the default model, 24)
#
# On the H200, one `run` each, back to back, on one warm machine:
#   parts 1..N-1: bash tools/drafter/device_stash.sh .device/drafter/pK   carry [".device/drafter/pK"]
#   part N:       the first device_train.sh call, carry [".device/drafter/pN"]: it joins the model
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
model=${1:-$HOME/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf}
mb=${2:-24}
rm -rf .device/drafter/p[0-9]* .device/drafter/parts
mkdir -p .device/drafter/parts
split -b "${mb}M" -d "$model" .device/drafter/parts/model.part.
n=0
for part in .device/drafter/parts/model.part.*; do
  n=$((n + 1))
  mkdir -p ".device/drafter/p$n"
  mv "$part" ".device/drafter/p$n/"
done
sha256sum "$model" | cut -d' ' -f1 > ".device/drafter/p$n/model.sha256"
rmdir .device/drafter/parts
du -sh .device/drafter/p*
