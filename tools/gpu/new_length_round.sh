#!/usr/bin/env bash
# A new prompt length on CUDA (after tools/gpu/unpack.sh's last parcel and the default
# model joined): the default model's prefill split (bench/gpu/prefill_split.py) with the
# engine's attention rule and with every chunk on cuDNN's kernel (the rule before
# MAX_SCORES); with HYBRID=1 first the Qwen3.5-0.8B shape's (its recurrence alone at 1, 2,
# 4 and 8 threads a value column: gated_delta_cuda.PREFILL_PAIR); then the GPU tests of the
# attention paths, the recurrence and the families' prefills.
#   [HYBRID=1] bash tools/gpu/new_length_round.sh [TEST_BUDGET s, default 300]
set -u
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
if [ "${HYBRID:-0}" = 1 ]; then
  shape=/root/shapes/qwen3.5-0.8b.gguf
  [ -f $shape ] || python3 -m bench shapes write --shape qwen3.5-0.8b --out /root/shapes > /dev/null
  timeout 280 python3 -m bench.gpu.prefill_split --model $shape --rows 128 512 2048 --runs 3 \
    --out "$OUT/prefill-split-hybrid.json" > /dev/null 2> "$OUT/prefill-split-hybrid.err"
  echo "== hybrid: exit $?"; tail -2 "$OUT/prefill-split-hybrid.err"
  python3 - "$OUT/prefill-split-hybrid.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode, lengths in d["gdn_prefill"].items():
    for rows, f in lengths.items():
        print(mode, rows, {k: f[k] for k in ("new_length_ms", "warm_ms", "warm_tok_s")})
for rows, kernels in d["gdn_kernel"].items():
    print("gdn", rows, {k: v["ms"] for k, v in kernels.items()})
PY
fi
for way in engine cudnn; do
  timeout 200 python3 -m bench.gpu.prefill_split --rows 128 512 2048 --runs 3 --attention $way \
    --out "$OUT/prefill-split-$way.json" > /dev/null 2> "$OUT/prefill-split-$way.err"
  echo "== $way: exit $?"; tail -2 "$OUT/prefill-split-$way.err"
  python3 - "$OUT/prefill-split-$way.json" $way <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for rows, f in d["gdn_prefill"]["chunked"].items():
    print(sys.argv[2], rows, {k: f[k] for k in ("cold_ms", "new_length_ms", "warm_ms", "build_ms", "eval_ms")})
PY
done
timeout "${1:-300}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
  tests/kernels/test_few_query_attention.py tests/kernels/test_gated_delta_cuda.py \
  tests/bench/test_prefill_split.py tests/engine/test_config.py \
  tests/engine/test_hybrid.py tests/engine/test_families_gemma3_state.py \
  tests/engine/test_sliding_ring.py tests/engine/test_fused_gemma3.py \
  tests/engine/test_fused_hybrid.py > "$OUT/tests.txt" 2>&1
echo "== tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | cut -c1-250 | head; tail -1 "$OUT/tests.txt"
