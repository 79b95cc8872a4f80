#!/usr/bin/env bash
# x in int8 (FQ_INT8, kernels/cuda/fused_step.cuh's fq_dot_i8) on the GPU, after
# tools/gpu/unpack.sh's last parcel. Parts (PARTS, default all three):
#   tests   tests/engine/test_fused_int8.py (a verify's rows exact, one pass and several;
#           the logits beside the CPU's int8 kernels; rounded once, the same bits), or
#           those $TESTS_K selects (pytest -k: TESTS_K=once)
#   stamps  where the int8 step's time goes against the engine's, phase by phase
#           (bench/gpu/step_probe.py under BRANCHCHAT_STEP_TUNING), a step and an 8-row verify,
#           for each of $STAMP_BUILDS (default: float x and int8 rounded once by the
#           producing phases, whose step was still 6-11% slower in session 44); each probe
#           gets $STAMP_TIMEOUT s (default 240: the float build's 8-row stamps ran past 150
#           in session 42)
#   ahead   each of $AHEAD_SHAPES (default the Llama-3.2-1B and 3.1-8B shapes): the step and
#           an 8-row verify of the engine's build (first and last) beside $INT8_WITH's builds
#   default the default model (SmolLM2-135M Q4_1, from pack.sh's parcels with models), whose
#           rows of 576 and 1,536 take int8 from FQ_INT8=512: its step and 8-row verify
#           beside the engine's build, then its decode agreement with a float64 reference
#           (bench agreement, the one-launch step) for each of $AGREE_BUILDS (default
#           "float FQ_INT8=512"); AGREE_ONLY=1 skips the step and verify, so the two halves
#           can go in two calls
#   spec    bench speculative (greedy, identical output checked) on the default model, with
#           the engine's build and with $SPEC_INT8 (default FQ_INT8=512,FQ_INT8_ONCE=1): a
#           cheaper verify is what speculation's ratio to plain decoding is bound by
#   PARTS="stamps ahead" AHEAD_SHAPES=llama-3.1-8b bash tools/gpu/int8_round.sh
set -u
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
parts=" ${PARTS:-tests stamps ahead} "
source tools/gpu/ahead_with.sh
if [[ $parts == *" tests "* ]]; then
  timeout "${TEST_BUDGET:-420}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/engine/test_fused_int8.py ${TESTS_K:+-k "$TESTS_K"} > "$OUT/int8-tests.txt" 2>&1
  echo "== tests: exit $?"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/int8-tests.txt" | cut -c1-300 | head
  tail -1 "$OUT/int8-tests.txt"
fi
if [[ $parts == *" stamps "* ]]; then
  big=${STAMP_SHAPE:-llama-3.2-1b}
  shape $big
  for build in ${STAMP_BUILDS:-"FQ_INT8=0" "FQ_INT8=2048,FQ_INT8_ONCE=1"}; do
    name=$(echo "$build" | tr ',=' '-_')
    BRANCHCHAT_STEP_TUNING=$build timeout "${STAMP_TIMEOUT:-240}" python3 -m bench.gpu.step_probe \
      --model /root/shapes/$big.gguf --contexts 128 --prefetch 1 --rows 1 8 \
      > "$OUT/int8-stamps-$big-$name.json" 2>&1
    echo "== stamps $big $build: exit $?"; tail -c 600 "$OUT/int8-stamps-$big-$name.json"
  done
fi
# the 8B's verify stages 8 rows of its MLP's 14,336 a pass: 128 KB (kernels/step_knobs.py);
# in the normed phases only (FQ_INT8_RESIDUAL=0) its rows are 4,096 long and need no more
big_x=FQ_VERIFY_SMEM_X=32768
with=${INT8_WITH:-"FQ_INT8=2048,$big_x;FQ_INT8=2048,FQ_INT8_ONCE=1,$big_x"}
if [[ $parts == *" ahead "* ]]; then
  ahead_with int8 "$with" FQ_INT8 FQ_INT8_ONCE FQ_VERIFY_SMEM_X
fi
default=$HOME/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ $parts == *" default "* ]] && [ -z "${AGREE_ONLY:-}" ]; then
  timeout 280 python3 -m bench.gpu.step_tuning --model "$default" --contexts 128 2048 \
    --repeats 50 --engine-with "FQ_INT8=512;FQ_INT8=512,FQ_INT8_ONCE=1" \
    --out "$OUT/int8-default.json" > "$OUT/int8-default.txt" 2>&1
  echo "== default step and verify: exit $?"; grep "^{" "$OUT/int8-default.txt" | cut -c1-400
fi
if [[ $parts == *" default "* ]]; then
  for build in ${AGREE_BUILDS:-float FQ_INT8=512}; do
    [ "$build" = float ] && build=""
    BRANCHCHAT_STEP_TUNING=$build timeout 150 python3 -m bench agreement --paths mlx-default \
      --modes decode --names smollm2 --json > "$OUT/agree-default-${build:-float}.json" 2>&1
    echo "== agreement ${build:-float}: exit $?"; tail -c 400 "$OUT/agree-default-${build:-float}.json"
  done
fi
if [[ $parts == *" spec "* ]]; then
  for build in "" "${SPEC_INT8:-FQ_INT8=512,FQ_INT8_ONCE=1}"; do
    BRANCHCHAT_STEP_TUNING=$build timeout "${SPEC_TIMEOUT:-270}" python3 -m bench speculative \
      --json --runs 1 --modes plain,auto,block --workloads chat,open_chat,regenerate \
      > "$OUT/spec-default-${build:-float}.json" 2> "$OUT/spec-default-${build:-float}.err"
    echo "== speculative ${build:-float}: exit $?"; tail -3 "$OUT/spec-default-${build:-float}.err"
  done
fi
