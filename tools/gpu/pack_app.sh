#!/usr/bin/env bash
# The app's own wheels for the lent GPU machine (tests/app has never run there: PySide6 is
# not on it): PySide6-Essentials and shiboken6 as the project pins them, qasync, pygments,
# ziamath, keyring, huggingface_hub and pytest-qt with their dependencies, for CPython
# 3.12 on manylinux x86-64, ~93 MB as one tar stream split into .device/app/a00.. (git-ignored;
# PARCEL_BYTES sets the size: the working tree plus one parcel must stay under 64 MiB).
# On the machine, after tools/gpu/unpack.sh's parcels (MLX in /root/site), one `run` each,
# carry [".device/app/aNN"]:
#   all but the last: bash tools/gpu/app_tests.sh .device/app/aNN   (keeps the parcel)
#   the last:         bash tools/gpu/app_tests.sh .device/app/aNN   (installs, runs tests/app)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
version=$(cd "$root" && .venv/bin/python -c 'import importlib.metadata as m; print(m.version("PySide6-Essentials"))')
rm -rf "$root/.device/app" && mkdir -p "$root/.device/app/payload/wheels" && cd "$root/.device/app"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d payload/wheels \
  "PySide6-Essentials==$version" "shiboken6==$version" "qasync>=0.27" "pygments>=2.15" \
  "ziamath>=0.13" "pytest-qt>=4.4" "keyring>=25" "huggingface_hub>=2.4,<3" 2>&1 \
  | { grep -v WARN || true; }
(cd payload && find wheels -type f -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
tar -cf - payload | split -b "${PARCEL_BYTES:-24600000}" -d - part.
for part in part.*; do mkdir "a${part#part.}" && mv "$part" "a${part#part.}/"; done
touch "$(ls -d a[0-9][0-9] | tail -1)/LAST"
rm -rf payload
du -sh a[0-9][0-9]
