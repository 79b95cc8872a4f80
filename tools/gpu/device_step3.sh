#!/usr/bin/env bash
# Step 3 on the H200 (carry .device/c): extra wheels, GPU tests, the fused-step probe.
set -u
export PYTHONPATH=/root/site:$PWD
cp .device/c/model.02 /root/stash/
python3 -m pip install -q --no-index --no-deps --target /root/site .device/c/wheels/*.whl 2>&1 | tail -2
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
timeout 480 python3 -m pytest -q -p no:cacheprovider tests/engine/test_fused_decode.py tests/engine/test_speculative.py \
  tests/kernels/test_gated_delta_cuda.py 2>&1 | tail -15
timeout 200 python3 -m bench.gpu.probe --quick --steps 300 > "$OUT/probe.json" 2> "$OUT/probe.err"
timeout 100 python3 -m bench.gpu.step_probe > "$OUT/step_probe.json" 2>&1; cat "$OUT/step_probe.json"
tail -5 "$OUT/probe.err"; cat "$OUT/probe.json"
