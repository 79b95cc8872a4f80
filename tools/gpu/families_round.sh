#!/usr/bin/env bash
# The step families' round on the H200 (issue 15: the hybrid and Gemma 3 through the
# one-launch step), after tools/gpu/unpack.sh's last parcel (PACK_MODELS=all brings Gemma
# 3 270M; none: the tiny models and random shapes only). In order, each bounded:
#   1. the step families' GPU tests, and those of speculation and the sliding rings beside
#      them (session 17: the bfloat16 state checks against plain decoding), the recurrence
#      kernels', the window mask's, the argmax read's and the converter's (mlx-lm on Qwen3
#      and Gemma 3 directories; session 18);
#   2. Gemma 3 270M's decode with its step and without (BRANCHCHAT_GEMMA_STEP=1 / 0);
#   3. the Qwen3.5-0.8B shape's decode through the step (and again with its prefill's
#      recurrence in the chunked form, BRANCHCHAT_GDN_PREFILL=chunked), the stamped
#      probe's phases and the host probe's profile of a decode step (bench/gpu/host_probe.py);
#   4. (PART=peers alone, after `tools/gpu/llama_cuda.sh build`) Gemma 3 270M and the 0.8B
#      shape beside llama.cpp's CUDA llama-bench and mlx-lm, decode and prefill;
#   5. (PART=split alone) where a prefill's time goes (bench/gpu/prefill_split.py): the 0.8B
#      shape's and the default model's, as tools/gpu/new_length_round.sh's "hybrid default".
# $OUT gets summary.txt and the logs (device_all.sh), gemma-*.json, hybrid-*.json/txt.
# The whole round can pass a call's 10 minutes: PART=tests runs 1 alone, PART=bench 2 and 3.
#   [PART=tests|bench|peers|split] bash tools/gpu/families_round.sh [TEST_BUDGET s, default 240]
set -u
export PYTHONPATH=/root/site:$PWD
gemma=$HOME/.cache/branchchat/models/gemma-3-270m-q4_k_m.gguf
if [ "${PART:-all}" = split ]; then  # the same probe as new_length_round.sh's parts
  PARTS="hybrid default" exec bash tools/gpu/new_length_round.sh
fi
if [ "${PART:-all}" = peers ]; then
  CONTEXTS=128,512,2048 SHAPE_TIMEOUT=240 RUNS=1 bash tools/gpu/shapes_bench.sh qwen3.5-0.8b
  [ -f "$gemma" ] || exit 0
  rm -f results/decode-*.json && mkdir -p "$OUT/gemma-peers"
  OUT=$OUT/gemma-peers timeout 240 bash tools/gpu/llama_cuda.sh bench --model "$gemma" \
    --contexts 128,512,2048 > "$OUT/gemma-peers.txt" 2>&1
  echo "== Gemma 3 270M beside its peers: exit $?"; tail -25 "$OUT/gemma-peers.txt"
  exit 0
fi
if [ "${PART:-all}" != bench ]; then
  SKIP_BENCH=1 SUITE_BUDGET=${1:-240} bash tools/gpu/device_all.sh \
    tests/engine/test_fused_gemma3.py tests/engine/test_fused_hybrid.py \
    tests/engine/test_fused_decode.py tests/engine/test_speculative.py \
    tests/engine/test_speculative_seeded.py tests/engine/test_block_drafter.py \
    tests/engine/test_sliding_ring.py tests/engine/test_families_gemma3_state.py \
    tests/kernels/test_gated_delta.py tests/kernels/test_gated_delta_cuda.py \
    tests/kernels/test_window_mask.py tests/kernels/test_mlx_argmax.py \
    tests/engine/test_convert_oracles.py 2>&1 | tail -25
fi
[ "${PART:-all}" != tests ] || exit 0
if [ -f "$gemma" ]; then
  for step in 1 0; do
    rm -f results/decode-*.json
    BRANCHCHAT_GEMMA_STEP=$step timeout 150 python3 -m bench decode --model "$gemma" \
      --runs 1 --steps 32 --contexts 128,2048 > "$OUT/gemma-step$step.txt" 2>&1
    echo "== Gemma 3 270M, step=$step: exit $?"; grep -E "^context|verify" "$OUT/gemma-step$step.txt"
    cp results/decode-*.json "$OUT/gemma-step$step.json" 2>/dev/null
  done
fi
shape=/root/shapes/qwen3.5-0.8b.gguf
[ -f $shape ] || python3 -m bench shapes write --shape qwen3.5-0.8b --out /root/shapes > /dev/null
rm -f results/decode-*.json
timeout 120 python3 -m bench decode --model $shape --runs 1 --steps 32 --contexts 128,2048 \
  > "$OUT/hybrid-step.txt" 2>&1
echo "== Qwen3.5-0.8B shape through the step: exit $?"; grep -E "^context|verify" "$OUT/hybrid-step.txt"
cp results/decode-*.json "$OUT/hybrid-step.json" 2>/dev/null
timeout 120 python3 -m bench.gpu.step_probe --model $shape --contexts 128 --prefetch 1 \
  > "$OUT/hybrid-phases.json" 2>&1
echo "== its phases: exit $?"; tail -c 1500 "$OUT/hybrid-phases.json"
rm -f results/decode-*.json  # its prefill chunks' recurrence in the chunked form
BRANCHCHAT_GDN_PREFILL=chunked timeout 120 python3 -m bench decode --model $shape --runs 1 \
  --steps 32 --contexts 128,2048 > "$OUT/hybrid-chunked-prefill.txt" 2>&1
echo "== the same, BRANCHCHAT_GDN_PREFILL=chunked: exit $?"
grep -E "^context|verify" "$OUT/hybrid-chunked-prefill.txt"
cp results/decode-*.json "$OUT/hybrid-chunked-prefill.json" 2>/dev/null
timeout 90 python3 -m bench.gpu.host_probe --model $shape > "$OUT/hybrid-host.json" 2>&1
echo "== its host time: exit $?"; head -c 2500 "$OUT/hybrid-host.json"
if [ -f "$gemma" ]; then
  timeout 90 python3 -m bench.gpu.host_probe --model "$gemma" > "$OUT/gemma-host.json" 2>&1
  echo "== Gemma's host time: exit $?"; head -c 1200 "$OUT/gemma-host.json"
fi
