#!/usr/bin/env bash
# One parcel of tools/gpu/restage.sh on the H200: keep its files in /root/stash; with the
# last part of MLX's CUDA wheel there (g3), join it and install MLX and the wheels.
set -eu
parcel=${1:?usage: bash tools/gpu/stash.sh .device/gN}
mkdir -p /root/stash
cp -r "$parcel"/* /root/stash/
if [ -f "$parcel/wheel-name" ]; then
  name=$(cat "$parcel/wheel-name")
  cat /root/stash/cuda.0[0-2] > "/root/$name"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /root/site /root/stash/mlx-*.whl "/root/$name" /root/stash/wheels/*.whl 2>&1 | { grep -v WARN || true; }
  PYTHONPATH=/root/site python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())'
fi
ls /root/stash | tr '\n' ' '
