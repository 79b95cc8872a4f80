#!/usr/bin/env bash
# One parcel of tools/gpu/pack.sh on the H200: keep it in /root/stash; once every part is
# there (the last parcel has come), join the tar stream, check it, install MLX and the
# wheels into /root/site, put the models where the engine keeps them, and build the C kernel
# for the device's Python.
set -eu
parcel=${1:?usage: bash tools/gpu/unpack.sh .device/pNN}
mkdir -p /root/stash
cp "$parcel"/part.* /root/stash/
ls /root/stash | tr '\n' ' '
[ -f "$parcel/LAST" ] || exit 0
cd /root && cat /root/stash/part.* | tar -xf - && rm -rf /root/stash
(cd /root/payload && sha256sum --quiet -c SHA256SUMS) && echo "payload sums ok"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /root/site /root/payload/wheels/*.whl 2>&1 | { grep -v WARN || true; }
models=$HOME/.cache/branchchat/models
mkdir -p "$models" && find /root/payload/models -type f -exec mv {} "$models/" \;
cd - > /dev/null
export PYTHONPATH=/root/site:$PWD
python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())'
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || tail -5 /tmp/build.log
