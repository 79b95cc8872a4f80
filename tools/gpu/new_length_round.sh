#!/usr/bin/env bash
# A new prompt length on CUDA, and the hybrid's recurrence (after tools/gpu/unpack.sh's last
# parcel and the default model joined). Parts, in order (PARTS, default all; each one
# fits a call's 10 minutes, two of them most pairs):
#   hybrid   the Qwen3.5-0.8B shape's prefill split (bench/gpu/prefill_split.py): both ways
#            of running its Gated DeltaNet rows, and the recurrence alone at 1, 2, 4 and 8
#            threads a value column, replay body and fetch-ahead body (PREFILL_PAIR,
#            PREFILL_PREFETCH)
#   pair     the shape's decode and prefill (python -m bench decode) with the step's and
#            replay's recurrence at each PAIR of $PAIRS (default 1 and 2, the value; $DECODE,
#            when set, the bench's arguments past --model)
#   default  the default model's prefill split with the engine's attention rule, with every
#            chunk on cuDNN's kernel (the rule before MAX_SCORES) and with every causal one
#            on the one-launch prefill attention (kernels/prefill_attention_cuda.py: its
#            tensor-core body for the model's bfloat16 K/V)
#   verify   where an 8-row verify spends its time beside a step (bench/gpu/step_probe.py,
#            phases by cycle stamps, at 128 and 2,048 context), for each of $PROBE_SHAPES
#            (default the hybrid's; the Llama shapes' phases were never stamped)
#   rows     the hybrid shape's step and 8-row verify (bench/gpu/step_tuning.py, every
#            build's logits against the engine's) with 2 (the engine's), 4 and 8 rows a
#            verify's pass, and the head's alone at 8 (FQ_HEAD_ROWS), the engine's other
#            hybrid knobs alike: session 34's probe put a verify's products at ~4x a
#            step's (4 passes of 2 rows) and its head at 4x
#   ahead    the Llama-3.2-1B and 3.1-8B shapes' step and verify ($AHEAD_SHAPES; the 8B
#            alone takes ~1.5 minutes once its shape is written, ~2 more to write it)
#            (bench/gpu/step_tuning.py --engine-with: the engine's build timed first and last)
#            beside session 36's verify (4 rows a pass, the step's staged x: the engine's took
#            8 rows and 24,576 floats in session 37), its x staged whole at 32,768, and its
#            head at 8 rows a pass. $AHEAD_WITH names other builds.
#   spec     each shape's speculative regenerate, fresh question and repeated question
#            ($SPEC_SHAPES, default the hybrid's; python -m bench speculative --model, greedy,
#            plain against Auto: identical tokens). Random weights give an edited question's
#            reply nothing of the first's (session 35: nothing drafted), so `repeat`, the
#            same question again, measures what the verify curve allows
#   tests    the GPU tests of the attention paths (the tensor-core body's among them), the
#            recurrence, the families' prefills and the warm-up at load ($TESTS, when set,
#            instead)
#   PARTS="hybrid pair" bash tools/gpu/new_length_round.sh [TEST_BUDGET s, default 300]
set -u
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
parts=" ${PARTS:-hybrid pair default tests} "
shape=/root/shapes/qwen3.5-0.8b.gguf
if [[ $parts == *" hybrid "* || $parts == *" pair "* || $parts == *" rows "* ]] && [ ! -f $shape ]; then
  python3 -m bench shapes write --shape qwen3.5-0.8b --out /root/shapes > /dev/null
fi
if [[ $parts == *" hybrid "* ]]; then
  timeout 280 python3 -m bench.gpu.prefill_split --model $shape --rows 128 512 2048 --runs 3 \
    --out "$OUT/prefill-split-hybrid.json" > /dev/null 2> "$OUT/prefill-split-hybrid.err"
  echo "== hybrid: exit $?"; tail -2 "$OUT/prefill-split-hybrid.err"
  python3 - "$OUT/prefill-split-hybrid.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode, lengths in d["gdn_prefill"].items():
    for rows, f in lengths.items():
        print(mode, rows, {k: f[k] for k in ("new_length_ms", "warm_ms", "warm_tok_s")})
        print("   in model", f.get("gdn_in_model"), f["layers"].get("GatedDeltaNet"))
for rows, kernels in d["gdn_kernel"].items():
    print("gdn", rows, {k: v["ms"] for k, v in kernels.items()})
PY
fi
# python3 -c "$WITH_PAIR" P MODULE ARGS...: python -m MODULE ARGS at gated_delta_cuda.PAIR = P
WITH_PAIR="
import runpy, sys
from kernels import gated_delta_cuda
gated_delta_cuda.PAIR = int(sys.argv[1])  # the step's build and the replay read it alike
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name='__main__')
"
if [[ $parts == *" pair "* ]]; then
  for pair in ${PAIRS:-1 2}; do
    rm -f results/decode-*.json
    timeout 200 python3 -c "$WITH_PAIR" $pair bench decode --model $shape \
      ${DECODE:---runs 2 --steps 32 --contexts 128,512,2048} > "$OUT/hybrid-pair$pair.txt" 2>&1
    echo "== hybrid decode, PAIR=$pair: exit $?"; grep -E "^context|verify|prefill" "$OUT/hybrid-pair$pair.txt" | head -12
    cp results/decode-*.json "$OUT/hybrid-pair$pair.json" 2>/dev/null
  done
fi
if [[ $parts == *" verify "* ]]; then
  for one in ${PROBE_SHAPES:-qwen3.5-0.8b}; do
    [ -f /root/shapes/$one.gguf ] || timeout 200 python3 -m bench shapes write --shape $one \
      --out /root/shapes > /dev/null
    timeout ${PROBE_TIMEOUT:-150} python3 -m bench.gpu.step_probe --model /root/shapes/$one.gguf \
      --rows 1 8 --contexts 128 2048 --prefetch 0 > "$OUT/step-probe-$one.json" 2> "$OUT/step-probe-$one.err"
    echo "== verify $one: exit $?"; tail -2 "$OUT/step-probe-$one.err"
    python3 - "$OUT/step-probe-$one.json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    for name, r in json.loads(line).items():
        for key, f in r.items():  # each context x rows figure: the kernel, its phases' intervals
            if isinstance(f, dict) and "kernel_us" in f:
                print(name, key, round(f["kernel_us"]), {k: round(v.get("interval", v["max_work"]), 1)
                      for k, v in f.items() if isinstance(v, dict)})
            elif not isinstance(f, dict):
                print(name, key, f)
PY
  done
fi
# python3 -c "$TUNING_ROWS" FILE KNOB...: bench/gpu/step_tuning.py's lines, with those knobs
TUNING_ROWS='
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(r["context"], [r["tuning"][k] for k in sys.argv[2:]],
              {k: v for k, v in r.items() if k not in ("context", "tuning")})
'
if [[ $parts == *" rows "* ]]; then  # slices:stream:rows:blocks:smem:vblocks:barrier
  timeout 240 python3 -m bench.gpu.step_tuning --model $shape --contexts 128 2048 \
    --configs 16:0:2:1:8192:0:1,16:0:2:1:8192:0:1:0:0:1:8,16:0:4:1:16384:0:1,16:0:4:1:16384:0:1:0:0:1:8,16:0:8:1:32768:0:1,16:0:2:1:8192:0:1 \
    --out "$OUT/verify-rows-hybrid.json" > "$OUT/verify-rows-hybrid.txt" 2>&1
  echo "== rows: exit $?"; grep -v "^{" "$OUT/verify-rows-hybrid.txt" | tail -3
  python3 -c "$TUNING_ROWS" "$OUT/verify-rows-hybrid.txt" FQ_VERIFY_ROWS FQ_HEAD_ROWS
fi
if [[ $parts == *" ahead "* ]]; then  # a verify's rows a pass, and words decoded as used
  for big in ${AHEAD_SHAPES:-llama-3.2-1b llama-3.1-8b}; do
    [ -f /root/shapes/$big.gguf ] || timeout 200 python3 -m bench shapes write --shape $big \
      --out /root/shapes > /dev/null
    timeout ${AHEAD_TIMEOUT:-280} python3 -m bench.gpu.step_tuning --model /root/shapes/$big.gguf \
      --contexts 128 2048 --repeats 30 --engine-with "${AHEAD_WITH:-FQ_VERIFY_ROWS=4,FQ_VERIFY_SMEM_X=0;\
FQ_VERIFY_SMEM_X=32768;FQ_HEAD_ROWS=8}" \
      --out "$OUT/ahead-$big.json" > "$OUT/ahead-$big.txt" 2>&1
    echo "== ahead $big: exit $?"; grep -v "^{" "$OUT/ahead-$big.txt" | tail -3
    python3 -c "$TUNING_ROWS" "$OUT/ahead-$big.txt" FQ_VERIFY_ROWS FQ_HEAD_ROWS FQ_STREAM
  done
fi
if [[ $parts == *" spec "* ]]; then  # each shape's regenerate, fresh question and ceiling
  for one in ${SPEC_SHAPES:-qwen3.5-0.8b}; do
    [ -f /root/shapes/$one.gguf ] || timeout 200 python3 -m bench shapes write --shape $one \
      --out /root/shapes > /dev/null
    timeout 240 python3 -m bench speculative --model /root/shapes/$one.gguf --runs 2 \
      --workloads regenerate,chat,repeat --json > "$OUT/speculative-$one.json" 2> "$OUT/speculative-$one.err"
    echo "== spec $one: exit $?"; grep -E "^run|Error" "$OUT/speculative-$one.err" | tail -12
  done
fi
if [[ $parts == *" default "* ]]; then
  for way in engine cudnn kernel; do
    # $PREFILL_MODEL: a shape's file where the default model's was not carried; a head size
    # of 64 or 128 (Llama-3.2-1B's), as the tensor-core body takes (the 0.8B's 256 does not)
    timeout 200 python3 -m bench.gpu.prefill_split ${PREFILL_MODEL:+--model $PREFILL_MODEL} \
      --rows 128 512 2048 --runs 3 --attention $way \
      --out "$OUT/prefill-split-$way.json" > /dev/null 2> "$OUT/prefill-split-$way.err"
    echo "== $way: exit $?"; tail -2 "$OUT/prefill-split-$way.err"
    python3 - "$OUT/prefill-split-$way.json" $way <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for rows, f in d["gdn_prefill"]["chunked"].items():
    print(sys.argv[2], rows, {k: f[k] for k in ("cold_ms", "new_length_ms", "warm_ms", "build_ms", "eval_ms")})
if sys.argv[2] == "kernel":  # one call at each new (rows, keys): first / again ms, difference
    for pair, ways in d["attention"].items():
        print("  ", pair, {w: (f["first_ms"], f["again_ms"], f["max_diff"]) for w, f in ways.items()
                           if w in ("causal", "matmul", "kernel", "kernel_scalar")})
PY
  done
fi
if [[ $parts == *" tests "* ]]; then
  timeout "${1:-300}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short ${TESTS:-\
    tests/kernels/test_prefill_attention_cuda.py \
    tests/kernels/test_few_query_attention.py tests/kernels/test_gated_delta_cuda.py \
    tests/bench/test_prefill_split.py tests/engine/test_config.py \
    tests/engine/test_hybrid.py tests/engine/test_families_gemma3_state.py \
    tests/engine/test_sliding_ring.py tests/engine/test_fused_gemma3.py \
    tests/engine/test_fused_hybrid.py tests/engine/test_warm_up.py} > "$OUT/tests.txt" 2>&1
  echo "== tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | cut -c1-250 | head; tail -1 "$OUT/tests.txt"
fi
