#!/usr/bin/env bash
# The app's own wheels for the lent GPU machine (tests/app has never run there: PySide6 is
# not on it): PySide6-Essentials and shiboken6 as the project pins them, qasync, pygments,
# ziamath, keyring, platformdirs, huggingface_hub and pytest-qt with their dependencies, for
# CPython 3.12 on manylinux x86-64, and the system libraries Qt's offscreen and xcb plugins
# load that the machine lacks (libGL, fontconfig, glib, xkbcommon, libxcb-*: session 36 found
# them missing there; copied from this Debian 12 machine, glibc 2.36, the machine has 2.39)
# with three DejaVu fonts, ~110 MB as one tar stream split into .device/app/a00.. (git-ignored;
# PARCEL_BYTES sets the size: the working tree plus one parcel must stay under 64 MiB).
# On the machine, after tools/gpu/unpack.sh's parcels (MLX in /root/site), one `run` each,
# carry [".device/app/aNN"]:
#   all but the last: bash tools/gpu/app_tests.sh .device/app/aNN   (keeps the parcel)
#   the last:         bash tools/gpu/app_tests.sh .device/app/aNN   (installs, runs tests/app)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
version=$(cd "$root" && .venv/bin/python -c 'import importlib.metadata as m; print(m.version("PySide6-Essentials"))')
qt=$("$root/.venv/bin/python" -c 'import PySide6, pathlib; print(pathlib.Path(PySide6.__file__).parent / "Qt")')
rm -rf "$root/.device/app" && mkdir -p "$root/.device/app/app-payload/wheels" && cd "$root/.device/app"
mkdir -p app-payload/syslibs/lib app-payload/syslibs/fonts
for so in "$qt"/lib/libQt6{Core,Gui,Widgets,Svg,DBus,XcbQpa,OpenGL}.so.6 \
  "$qt"/plugins/platforms/lib{qoffscreen,qxcb}.so "$qt"/plugins/{imageformats,iconengines}/*.so; do
  ldd "$so" 2>/dev/null || true
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v PySide6 | sort -u \
  | grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so' \
  | xargs -I{} cp -L {} app-payload/syslibs/lib/
# and every library the xcb plugin's check names (app/system_check.py), which ldd lists only
# where this machine has it (session 37: icccm and keysyms were not here, so not carried)
"$root/.venv/bin/python" -c 'from app.system_check import DEBIAN_PACKAGES as d; [print(*i) for i in d.items()]' \
  | while read -r so package; do
  lib=$(ldconfig -p | awk -v so="$so" '$1 == so {print $NF; exit}')
  if [ -n "$lib" ]; then cp -L "$lib" app-payload/syslibs/lib/; else
    echo "pack_app: $so is not on this machine (apt-get install $package)" >&2; exit 1; fi
done
cp /usr/share/fonts/truetype/dejavu/DejaVuSans{,-Bold,Mono}.ttf app-payload/syslibs/fonts/
printf '<?xml version="1.0"?>\n<fontconfig><dir>/root/syslibs/fonts</dir>%s</fontconfig>\n' \
  '<cachedir>/tmp/fc-cache</cachedir>' > app-payload/syslibs/fonts.conf
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d app-payload/wheels \
  "PySide6-Essentials==$version" "shiboken6==$version" "qasync>=0.27" "pygments>=2.15" \
  "ziamath>=0.13" "pytest-qt>=4.4" "keyring>=25" "platformdirs>=4" "huggingface_hub>=2.4,<3" 2>&1 \
  | { grep -v WARN || true; }
(cd app-payload && find wheels syslibs -type f -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
tar -cf - app-payload | split -b "${PARCEL_BYTES:-24600000}" -d - part.
for part in part.*; do mkdir "a${part#part.}" && mv "$part" "a${part#part.}/"; done
touch "$(ls -d a[0-9][0-9] | tail -1)/LAST"
rm -rf app-payload
du -sh a[0-9][0-9]
