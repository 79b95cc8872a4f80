#!/usr/bin/env bash
# On the H200 after tools/gpu/unpack.sh's last parcel: the test suite (every file of tests/
# but tests/app, whose PySide6 is not on the machine), each file its own pytest, 12 at a
# time, the longest first; beside it the agreement bench of both real models in MLX's
# default dtype and float32 (and the default dtype's decode on the plain path, which has no
# fused kernel: the two differ in where bfloat16 rounds), and the France prompt.
# $OUT gets suite.tar.gz (a log per file), summary.txt and the bench's JSON.
# Usage: bash tools/gpu/device_all.sh [test files...]   (default: the whole suite)
set -u
export PYTHONPATH=/root/site:$PWD
logs=/tmp/logs
rm -rf $logs && mkdir -p $logs/tests
python3 tools/gpu/tf32_probe.py > $logs/probe.txt 2>&1
MLX_ENABLE_TF32=0 python3 tools/gpu/tf32_probe.py >> $logs/probe.txt 2>&1
budget=${SUITE_BUDGET:-430}
if [ -z "${SKIP_BENCH:-}" ]; then
  (
    timeout 300 python3 -m bench agreement --paths mlx-default mlx-float32 --out "$OUT" \
      > $logs/agreement.txt 2>&1
    mkdir -p "$OUT/plain"
    BRANCHCHAT_FUSED=0 timeout 120 python3 -m bench agreement --paths mlx-default \
      --modes decode --out "$OUT/plain" >> $logs/agreement.txt 2>&1
  ) &
  timeout 200 python3 -m engine generate --prompt "What is the capital of France?" \
    --temperature 0 --max-tokens 24 > $logs/paris.txt 2>&1 &
fi
heavy="tests/engine/test_gguf_kquant_models.py tests/engine/test_models.py tests/oracles/test_real_oracles.py tests/engine/test_hybrid.py tests/engine/test_drafters.py"
if [ $# -gt 0 ]; then files="$*"; else
  files="$heavy $(find tests -name 'test_*.py' -not -path 'tests/app/*' | xargs ls -S | grep -v -F -x -f <(tr ' ' '\n' <<< "$heavy"))"
fi
tr ' ' '\n' <<< "$files" | grep . > $logs/files.txt
mkdir -p /tmp/pt
export deadline=$(($(date +%s) + budget)) logs
# SIGINT at the deadline: a file cut short still prints pytest's summary of failures; a file
# not yet started by then is not started (suite_summary.py lists both)
xargs -P 12 -I{} bash -c 'left=$((deadline - $(date +%s))); [ $left -gt 10 ] || exit 0
  timeout -s INT -k 20 $left python3 -m pytest -q -p no:cacheprovider -rfE --durations=3 \
    --basetemp=/tmp/pt/$(echo {} | tr / _) {} > $logs/tests/$(echo {} | tr / _).log 2>&1' \
  < $logs/files.txt
wait
python3 tools/gpu/suite_summary.py $logs/tests $logs/files.txt > "$OUT/summary.txt"
cat $logs/probe.txt "$OUT/summary.txt"
echo "== France prompt:"; cat $logs/paris.txt 2>/dev/null
echo "== agreement:"; cat $logs/agreement.txt 2>/dev/null
cp $logs/agreement.txt $logs/paris.txt "$OUT/" 2>/dev/null
tar -czf "$OUT/suite.tar.gz" -C $logs .
