#!/usr/bin/env bash
# On the H200 after restage.sh's g1-g5 (carry .device/g6): the agreement bench of the
# default model (JSON to $OUT) beside the tests that failed there before, the dtype tests
# and the oracle tests, which share the GPU (the bench measures numerics, not time).
set -u
export PYTHONPATH=/root/site:$PWD
source tools/gpu/join_model.sh
timeout "${BENCH_BUDGET:-240}" python3 -m bench agreement --names smollm2 --out "$OUT" \
  > "$OUT/agreement.txt" 2>&1 &
timeout -s INT "${TEST_BUDGET:-240}" python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/engine/test_drafters.py tests/engine/test_gguf_kquant_models.py \
  tests/engine/test_families_llama_rope.py tests/engine/test_tolerances.py \
  tests/engine/test_models.py tests/engine/test_hybrid.py tests/engine/test_state_io.py \
  tests/engine/test_convert.py tests/oracles > "$OUT/tests.txt" 2>&1 &
wait
cat "$OUT/agreement.txt"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | cut -c1-200
tail -1 "$OUT/tests.txt"
