#!/usr/bin/env bash
# On the H200 after steps 1-3 of stage.sh's parcels (carry .device/d) or restage.sh's
# g1-g5 (carry .device/g6): join the default model, build the C kernel for the device's
# Python (join_model.sh), check what float32 means to MLX there, then the test suite in
# six processes (16 cores, one GPU). Logs go into $OUT/suite.tar.gz ($OUT returns <= 8 files).
# Usage: bash tools/gpu/device_suite.sh [pytest args...]
set -u
export PYTHONPATH=/root/site:$PWD
source tools/gpu/join_model.sh
logs=/tmp/suite-logs
mkdir -p $logs
python3 -c 'import kernels._qmatmul, mlx.core as mx; print("qmatmul, mlx", mx.__version__, mx.default_device())'
python3 tools/gpu/tf32_probe.py
MLX_ENABLE_TF32=0 python3 tools/gpu/tf32_probe.py
groups=("tests/engine/test_[a-d]*.py" "tests/engine/test_e*.py" "tests/engine/test_[f-m]*.py"
  "tests/engine/test_[n-r]*.py" "tests/engine/test_[s-z]*.py" "tests/kernels tests/tools")
for i in "${!groups[@]}"; do
  # SIGINT: pytest still prints its summary of failures when the budget runs out
  # shellcheck disable=SC2086  # the globs expand here
  timeout -s INT "${SUITE_BUDGET:-420}" python3 -m pytest -q -p no:cacheprovider \
    --basetemp=/tmp/pt$i -rfE --durations=8 ${groups[$i]} "$@" > $logs/suite$i.log 2>&1 &
done
wait
for i in "${!groups[@]}"; do
  echo "== ${groups[$i]}"
  grep -E "^(FAILED|ERROR)" $logs/suite$i.log | cut -c1-160
  tail -1 $logs/suite$i.log
done
tar -czf "$OUT/suite.tar.gz" -C $logs .
