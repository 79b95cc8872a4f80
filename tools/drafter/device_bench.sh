#!/usr/bin/env bash
# On the lent H200: the installed block drafter through the engine, beside plain decoding
# and prompt lookup alone (`python -m bench speculative`, the fused one-launch step in the
# default dtype), with MLX unpacked by tools/gpu/unpack.sh and the default model joined in
# the engine's folder. The open-chat workloads run first, so a call cut at its limit
# still returns them.
#
#   bash tools/drafter/device_bench.sh [RUNS]      (default 1; JSON under $OUT)
#
# The drafter's measuring round, from a fresh machine (one `run` each, back to back):
#   bash tools/drafter/stage_model.sh   (here, once; AFTER tools/gpu/stage.sh, whose
#                                        workplace stager empties .device/)
#   PACK_MODELS=none PARCEL_BYTES=24000000 bash tools/gpu/pack.sh        (here: p00..p04)
#   1-3  carry .device/drafter/pK:  bash tools/drafter/device_stash.sh .device/drafter/pK
#   4    carry .device/drafter/p4:  JOIN_ONLY=1 bash tools/drafter/device_bench.sh
#   5..  carry .device/pNN:         bash tools/gpu/unpack.sh .device/pNN
#   last carry the last .device/pNN: bash tools/gpu/unpack.sh .device/pNN &&
#                                    bash tools/drafter/device_bench.sh
# (unpack.sh empties /root/stash when the last parcel comes, so the model is joined first.)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT must name the folder whose files come back}
models=$HOME/.cache/branchchat/models
gguf=$models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
  cp .device/drafter/p*/model.* /root/stash/drafter/ 2>/dev/null || true
  mkdir -p "$models"
  cat /root/stash/drafter/model.part.* > "$gguf"
  echo "$(cat /root/stash/drafter/model.sha256)  $gguf" | sha256sum -c
fi
[ "${JOIN_ONLY:-0}" = 1 ] && exit 0
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader || true
sha256sum engine/drafters/*.safetensors
runs=${1:-1}
for workloads in chat,open_chat mixed,regenerate,code; do
  python3 -m bench speculative --json --runs "$runs" --modes plain,auto,block \
    --workloads "$workloads" > "$out/speculative-block-${workloads//,/-}.json"
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps(r, indent=1)[:3000])" "$out/speculative-block-${workloads//,/-}.json"
done
# which member drafts each round there, split by whether lookup had a match (the rule that
# lookup goes first with a match was decided on the CPU's counts: docs/BENCHMARKS.md)
python3 -m tools.drafter.pool_rounds --workload open_chat | tail -n 1 > "$out/pool-rounds-open-chat.json"
python3 -m tools.drafter.pool_rounds --workload open_chat --rank-only | tail -n 1 \
  > "$out/pool-rounds-open-chat-rank-only.json"
cat "$out"/pool-rounds-*.json
