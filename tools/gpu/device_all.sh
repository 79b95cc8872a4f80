#!/usr/bin/env bash
# On the H200 after tools/gpu/unpack.sh's last parcel: the test suite (every file of tests/
# but tests/app, whose PySide6 is not on the machine; device_tests.sh runs it), and beside
# it the agreement bench of both real models in MLX's default dtype and float32 (and the
# default dtype's decode on the plain path, without the fused kernels: the two round in
# different places), and the France prompt.
# $OUT gets suite.tar.gz (a log per file or shard), summary.txt and the bench's JSON.
# Usage: bash tools/gpu/device_all.sh [test files...]   (default: the whole suite)
set -u
export PYTHONPATH=/root/site:$PWD
logs=/tmp/logs
rm -rf $logs && mkdir -p $logs
source tools/gpu/device_tests.sh
python3 tools/gpu/tf32_probe.py > $logs/probe.txt 2>&1
MLX_ENABLE_TF32=0 python3 tools/gpu/tf32_probe.py >> $logs/probe.txt 2>&1
if [ -z "${SKIP_BENCH:-}" ]; then
  (
    timeout 300 python3 -m bench agreement --paths mlx-default mlx-float32 --out "$OUT" \
      > $logs/agreement.txt 2>&1
    mkdir -p "$OUT/plain"
    BRANCHCHAT_FUSED=0 timeout 120 python3 -m bench agreement --paths mlx-default \
      --modes decode --out "$OUT/plain" >> $logs/agreement.txt 2>&1
  ) &
  timeout 200 python3 -m engine generate --prompt "What is the capital of France?" \
    --temperature 0 --max-tokens 24 --no-prompt-cache > $logs/paris.txt 2>&1 &
fi
if [ $# -eq 0 ]; then  # the longest first; $EXTRA_UNITS (test ids) before them
  set -- ${EXTRA_UNITS:-} $SHARDED tests/engine/test_gemma3_session.py $(find tests -name 'test_*.py' \
    -not -path 'tests/app/*' | xargs ls -S | grep -v -x -F -e tests/engine/test_gemma3_session.py \
    $(printf -- ' -e %s' $SHARDED))
fi
run_tests "$@"
wait
cat $logs/probe.txt "$OUT/summary.txt"
echo "== France prompt:"; cat $logs/paris.txt 2>/dev/null
echo "== agreement:"; cat $logs/agreement.txt 2>/dev/null
cp $logs/agreement.txt $logs/paris.txt "$OUT/" 2>/dev/null
tar -czf "$OUT/suite.tar.gz" -C $logs .
