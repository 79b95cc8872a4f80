#!/usr/bin/env bash
# The drafter's training on the lent H200 in one call (a call runs 10 minutes at most):
# generate the target's replies once, train for MINUTES (resuming the checkpoint an
# earlier call left on this machine), export, and put what should come back under $OUT.
#
#   bash tools/drafter/device_train.sh GGUF MINUTES [STATE]
#
#   GGUF     the target, SmolLM2-135M-Instruct.Q4_1.gguf (98 MB: more than one call may
#            carry; join it first, as tools/gpu/join_model.sh does)
#   MINUTES  training time in this call: leave ~1 minute for loading and export, and on
#            the first call the generation's time too
#   STATE    sequences and checkpoint, kept between calls while the machine stays warm
#            (default /root/drafter). A carried tools/drafter/seqs.npz (an earlier
#            call's $OUT/seqs.npz) is used instead of generating again.
# GEN_ARGS and TRAIN_ARGS add arguments to the generate and train steps (train's only
# count on a fresh run: a resumed one keeps its saved settings).
# Back under $OUT: block_drafter.safetensors (+ .sha256), seqs.npz, log.jsonl and the logs.
set -euo pipefail
usage="usage: device_train.sh GGUF MINUTES [STATE]"
gguf=$(realpath "${1:?$usage}")
minutes=${2:?$usage}
state=${3:-/root/drafter}
out=${OUT:?OUT must name the folder whose files come back}
cd "$(dirname "$0")/../.."
mkdir -p "$state" "$out"
train="python3 -m tools.drafter.train"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c 'import torch, transformers, safetensors as s; print(torch.__version__, transformers.__version__, s.__version__)'
if [ ! -f "$state/seqs.npz" ] && [ -f tools/drafter/seqs.npz ]; then
  cp tools/drafter/seqs.npz "$state/seqs.npz"
fi
if [ ! -f "$state/seqs.npz" ]; then
  # shellcheck disable=SC2086  # GEN_ARGS is a list of arguments
  $train generate --model "$gguf" --out "$state/seqs.partial.npz" ${GEN_ARGS:-} 2>&1 \
    | tee "$out/generate.log"
  mv "$state/seqs.partial.npz" "$state/seqs.npz"  # a killed generation leaves no seqs.npz
fi
# shellcheck disable=SC2086
$train train --model "$gguf" --data "$state/seqs.npz" --out "$state/run" --resume \
  --minutes "$minutes" ${TRAIN_ARGS:-} 2>&1 | tee "$out/train.log"
$train export --model "$gguf" --out "$state/run" --file "$out/block_drafter.safetensors" 2>&1 \
  | tee "$out/export.log"
cp "$state/seqs.npz" "$state/run/log.jsonl" "$out/"
