#!/usr/bin/env bash
# The H200 image's nvcc (13.0) on a machine without a GPU, from PyPI, for the CUDA source
# tests (tests/kernels/test_fused_step_source.py: every build compiled as MLX wraps it, the
# spills read from ptxas), which skip where there is no nvcc. Installed once into
# .device/nvcc (git-ignored; tools/gpu/stage.sh's wipe of .device takes it too), then the
# tests run with it. The version matters: nvcc 13.5 spills 16 bytes in Qwen3-4B's verify
# build that 13.0, the H200's, does not.
#   bash tools/gpu/nvcc_here.sh [tests and pytest arguments]   (none: the CUDA source tests)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
env=$root/.device/nvcc
if [ ! -x "$env/bin/python" ]; then
  python3 -m venv "$env"
  "$env/bin/pip" install -q nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
fi
bin=$(echo "$env"/lib/python3*/site-packages/nvidia/cu13/bin)
cd "$root"
PATH=$bin:$PATH .venv/bin/python -m pytest -q "${@:-tests/kernels/test_fused_step_source.py}"
