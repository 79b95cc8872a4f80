#!/usr/bin/env bash
# tests/app on the lent GPU machine: one parcel of tools/gpu/pack_app.sh a call, kept in
# /root/app-stash; with the last one, the wheels go into /root/site beside MLX (after
# tools/gpu/unpack.sh), Qt's offscreen platform is tried (the system libraries it lacks
# are named), and every file of tests/app runs through device_tests.sh's run_tests, the
# engine on MLX's GPU as a Mac user's `make test` has it. $OUT: summary.txt, app-suite.tar.gz.
#   bash tools/gpu/app_tests.sh .device/app/aNN      [SUITE_BUDGET, default 300 s]
set -u
parcel=${1:?usage: bash tools/gpu/app_tests.sh .device/app/aNN}
mkdir -p /root/app-stash && cp "$parcel"/part.* /root/app-stash/
ls /root/app-stash | tr '\n' ' '
[ -f "$parcel/LAST" ] || exit 0
(cd /root && cat app-stash/part.* | tar -xf - && rm -rf app-stash)
(cd /root/payload && sha256sum --quiet -c SHA256SUMS) && echo "app wheels: sums ok"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /root/site /root/payload/wheels/*.whl 2>&1 | { grep -v WARN || true; }
export PYTHONPATH=/root/site:$PWD QT_QPA_PLATFORM=offscreen
python3 - <<'PY' || { ldd /root/site/PySide6/Qt/lib/libQt6Gui.so.6 | grep "not found"; exit 1; }
from PySide6.QtWidgets import QApplication, QLabel
app = QApplication([])
print("Qt offscreen:", QLabel("ok").text(), app.platformName())
PY
logs=/tmp/app-logs
rm -rf $logs && mkdir -p $logs
source tools/gpu/device_tests.sh
SUITE_BUDGET=${SUITE_BUDGET:-300} SHARDED="" run_tests $(find tests/app -name 'test_*.py' | xargs ls -S)
cat "$OUT/summary.txt"
tar -czf "$OUT/app-suite.tar.gz" -C $logs .
