#!/usr/bin/env bash
# The 16-byte loads of 4-bit rows (FQ_WIDE) and the swizzled staged x (FQ_SWIZZLE) on the GPU,
# after tools/gpu/unpack.sh's last parcel. Parts (PARTS, default both):
#   tests  tests/engine/test_fused_wide.py, and the same-bits test's swizzled builds
#   ahead  each of $AHEAD_SHAPES (default the Llama-3.2-1B and 3.1-8B shapes): the step and
#          an 8-row verify of the engine's build (first and last) beside $WIDE_WITH's builds
#          (bench/gpu/step_tuning.py --engine-with; a wide build's logits are not the
#          engine's bits: max_gap_first says how far they are)
#   PARTS=ahead AHEAD_SHAPES=llama-3.1-8b bash tools/gpu/wide_round.sh
set -u
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
parts=" ${PARTS:-tests ahead} "
if [[ $parts == *" tests "* ]]; then
  timeout "${TEST_BUDGET:-240}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/engine/test_fused_wide.py tests/engine/test_fused_decode.py -k "wide or SWIZZLE" \
    > "$OUT/wide-tests.txt" 2>&1
  echo "== tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/wide-tests.txt" | cut -c1-300 | head
  tail -1 "$OUT/wide-tests.txt"
fi
wide="FQ_SWIZZLE=1;FQ_SWIZZLE=1,FQ_WIDE=2048,FQ_WIDE_SLICES=2;FQ_SWIZZLE=1,FQ_WIDE=2048;\
FQ_SWIZZLE=1,FQ_WIDE=2048,FQ_WIDE_SLICES=8,FQ_BLOCKS=1"
if [[ $parts == *" ahead "* ]]; then
  source tools/gpu/ahead_with.sh
  ahead_with wide "${WIDE_WITH:-$wide}" FQ_SWIZZLE FQ_WIDE FQ_WIDE_SLICES FQ_BLOCKS
fi
