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
  for big in ${AHEAD_SHAPES:-llama-3.2-1b llama-3.1-8b}; do
    [ -f /root/shapes/$big.gguf ] || timeout 200 python3 -m bench shapes write --shape $big \
      --out /root/shapes > /dev/null
    timeout "${AHEAD_TIMEOUT:-280}" python3 -m bench.gpu.step_tuning \
      --model /root/shapes/$big.gguf --contexts 128 2048 --repeats 30 \
      --engine-with "${WIDE_WITH:-$wide}" --out "$OUT/wide-$big.json" > "$OUT/wide-$big.txt" 2>&1
    echo "== ahead $big: exit $?"; grep -v "^{" "$OUT/wide-$big.txt" | tail -3
    python3 - "$OUT/wide-$big.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        knobs = [r["tuning"][k] for k in ("FQ_SWIZZLE", "FQ_WIDE", "FQ_WIDE_SLICES", "FQ_BLOCKS")]
        print(r["context"], knobs, {k: v for k, v in r.items() if k not in ("context", "tuning")})
PY
  done
fi
