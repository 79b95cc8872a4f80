#!/usr/bin/env bash
# Sourced by a GPU round's script, from the project root, after tools/gpu/unpack.sh's last
# parcel: $out (the folder whose files come back), the installed MLX on the path, the
# default model's file as $gguf, and the kernel builds compiled once, untimed. Their first
# compile (nvrtc) takes over a minute for the step's decode and verify builds on a fresh
# machine, and MLX keeps them on disk after, so no timed part of the round is cut by its
# limit while compiling (session 25's second round lost every figure so).
out=${OUT:?OUT must name the folder whose files come back}
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
gguf=$HOME/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 400 python3 -m bench speculative --json --runs 1 --modes plain,auto --workloads code \
  --max-tokens 24 > /dev/null 2>&1 || echo "warm-up: rc $?"
