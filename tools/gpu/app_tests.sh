#!/usr/bin/env bash
# tests/app on the lent GPU machine: one parcel of tools/gpu/pack_app.sh a call, kept in
# /root/app-stash; with the last one (after tools/gpu/unpack.sh put MLX in /root/site) the
# wheels go into /root/app-site and the system libraries into /root/syslibs, Qt's offscreen
# platform is tried (the libraries still missing are named), and every file of tests/app
# runs through device_tests.sh's run_tests, the engine on MLX's GPU as a Mac user's
# `make test` has it. $OUT: summary.txt, app-suite.tar.gz.
#   bash tools/gpu/app_tests.sh .device/app/aNN      [SUITE_BUDGET, default 300 s]
set -u
parcel=${1:?usage: bash tools/gpu/app_tests.sh .device/app/aNN}
mkdir -p /root/app-stash && cp "$parcel"/part.* /root/app-stash/
ls /root/app-stash | tr '\n' ' '
[ -f "$parcel/LAST" ] || exit 0
(cd /root && cat app-stash/part.* | tar -xf - && rm -rf app-stash)
(cd /root/app-payload && sha256sum --quiet -c SHA256SUMS) && echo "app payload: sums ok"
# A target of its own: PySide6 in /root/site would load pytest-qt, and so Qt's libraries, in
# every other round's pytest run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /root/app-site /root/app-payload/wheels/*.whl 2>&1 | { grep -v WARN || true; }
rm -rf /root/syslibs && mv /root/app-payload/syslibs /root/syslibs
export PYTHONPATH=/root/app-site:/root/site:$PWD QT_QPA_PLATFORM=offscreen
export LD_LIBRARY_PATH=/root/syslibs/lib FONTCONFIG_FILE=/root/syslibs/fonts.conf
# Qt's first text layout builds fontconfig's cache; done here, not in a timed test's loop.
python3 - <<'PY' || { ldd /root/app-site/PySide6/Qt/lib/libQt6Gui.so.6 | grep "not found"; exit 1; }
from PySide6.QtWidgets import QApplication, QLabel
app = QApplication([])
label = QLabel("ok <b>bold</b> <code>mono</code>")
label.show()
app.processEvents()
print("Qt offscreen:", label.text(), app.platformName())
PY
logs=/tmp/app-logs
rm -rf $logs && mkdir -p $logs
source tools/gpu/device_tests.sh
SUITE_BUDGET=${SUITE_BUDGET:-300} SHARDED="" run_tests $(find tests/app -name 'test_*.py' | xargs ls -S)
cat "$OUT/summary.txt"
tar -czf "$OUT/app-suite.tar.gz" -C $logs .
