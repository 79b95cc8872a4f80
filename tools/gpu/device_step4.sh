#!/usr/bin/env bash
# Step 4 on the H200 (carry .device/d): join the default model, then its benches.
set -u
export PYTHONPATH=/root/site:$PWD
dest=$HOME/.cache/branchchat/models
mkdir -p "$dest"
cat /root/stash/model.00 /root/stash/model.01 /root/stash/model.02 .device/d/model.03 \
  > "$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$(cat .device/d/model.sha256)  $dest/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c
source tools/gpu/device_run.sh
run decode decode --runs 3 --steps 64
BUDGET=240 run speculative speculative --runs 3
BRANCHCHAT_FUSED=0 run decode_plain decode --runs 2 --steps 64
ls -la "$OUT"
