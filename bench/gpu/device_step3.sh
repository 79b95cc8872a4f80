#!/usr/bin/env bash
# Step 3 on the H200 (carry .device/c): extra wheels, GPU tests, the hybrid benches.
set -u
export PYTHONPATH=/root/site:$PWD
cp .device/c/model.02 /root/stash/
python3 -m pip install -q --no-index --no-deps --target /root/site .device/c/wheels/*.whl 2>&1 | tail -2
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gated_delta_cuda.py \
  tests/kernels/test_gated_delta.py tests/engine/test_compiled_decode.py 2>&1 | tail -5
python3 -m bench rollback --json > "$OUT/rollback.json" 2> "$OUT/rollback.err"; tail -3 "$OUT/rollback.err"
cp results/*.json "$OUT/" 2>/dev/null; ls "$OUT"
