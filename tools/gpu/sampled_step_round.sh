#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel): where a sampled step's time
# goes beside a greedy one's (the app's default: 0.7 / 0.95), and sampled speculation since
# lookup judges the proposals its cut drops (session 29). Parts, in order (PARTS, default
# all of them):
#   tests  the pack kernel's and lookup's tests
#   pack   the pack kernel alone (bench/gpu/pack_probe.py), and with PACK_OTHER=DIR the
#          kernel of DIR/nucleus_pack.cu and .cuh beside it, for the default model's
#          vocabulary and Qwen3's
#   ncu    each kernel's device time over a few queued decode steps, greedy and sampled
#          (Nsight Compute, clocks left alone), summed by kernel name
#   host   the host probe through the engine's decode loop, greedy and sampled
#   split  the loop's time split (bench/gpu/loop_probe.py --lookup): the device's time a step with
#          steps queued on one another, and the host's launches, reads and draws in the loop
#          (the draw's pack read, decision and whole-row draws); the loop with prompt lookup
#          beside the plain one, from random tokens (Auto's bookkeeping a step)
#   bench  sampled plain and Auto on the bench's workloads (RUNS, default 2; WORKLOADS)
#   greedy the same, greedy (tokens identical to plain decoding's or not)
#     bash tools/gpu/sampled_step_round.sh
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
parts=" ${PARTS:-tests pack ncu host split bench} "
sampled=(--temperature 0.7 --top-p 0.95)
if [[ $parts == *" tests "* ]]; then
  timeout -s INT 240 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/kernels/test_nucleus_pack_cuda.py tests/kernels/test_nucleus_pack_source.py \
    tests/engine/test_match_acceptance.py > "$out/sampled-round-tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$out/sampled-round-tests.txt" | cut -c1-300 | head -20
  tail -1 "$out/sampled-round-tests.txt"
fi
if [[ $parts == *" pack "* ]]; then
  other=()
  [ -n "${PACK_OTHER:-}" ] && other=(--body "$PACK_OTHER/nucleus_pack.cu" --header "$PACK_OTHER/nucleus_pack.cuh")
  for vocab in 49152 151936; do
    timeout 120 python3 -m bench.gpu.pack_probe --vocab $vocab "${other[@]}" 2>&1 | tail -12
  done > "$out/pack-probe.txt"
  cat "$out/pack-probe.txt"
fi
if [[ $parts == *" ncu "* ]]; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for mode in greedy sampled; do
    args=()
    [ $mode = sampled ] && args=("${sampled[@]}")
    timeout 200 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
      python3 -m bench.gpu.host_probe --model "$gguf" --loop --steps 20 --top 5 "${args[@]}" \
      > "$out/ncu-$mode.csv" 2> /dev/null
  done
  python3 - "$out" <<'PY' | tee "$out/ncu-summary.txt"
import csv, io, statistics, sys
for mode in ("greedy", "sampled"):
    text = open(f"{sys.argv[1]}/ncu-{mode}.csv").read()
    rows = [r for r in csv.DictReader(io.StringIO(text[text.find('"ID"'):]))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    times = {}
    for r in rows[-400:]:  # the last steps': the profiled run's, past prefill and warm-up
        times.setdefault(r["Kernel Name"][:60], []).append(float(r["Metric Value"].replace(",", "")))
    print(mode, len(rows), "kernels; the last", min(400, len(rows)), "by name (count, median, unit",
          rows[-1]["Metric Unit"] if rows else "-", ")")
    for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {len(ts):4d} {statistics.median(ts):10.1f}  {name}")
PY
fi
if [[ $parts == *" host "* ]]; then
  for mode in greedy sampled; do
    args=()
    [ $mode = sampled ] && args=("${sampled[@]}")
    timeout 120 python3 -m bench.gpu.host_probe --model "$gguf" --loop --steps "${STEPS:-300}" \
      --top 30 "${args[@]}" > "$out/host-loop-$mode.json" 2> /dev/null
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['step_us'], 'us a step')" \
      "$out/host-loop-$mode.json" $mode
  done
fi
if [[ $parts == *" split "* ]]; then
  timeout 240 python3 -m bench.gpu.loop_probe --model "$gguf" --steps "${STEPS:-300}" --lookup \
    > "$out/loop-split.json" 2> "$out/loop-split.err"
  cat "$out/loop-split.json"; tail -3 "$out/loop-split.err"
fi
for mode in bench greedy; do
  [[ $parts == *" $mode "* ]] || continue
  args=("${sampled[@]}" --seed 0)
  [ $mode = greedy ] && args=()
  timeout 300 python3 -m bench speculative --json --runs "${RUNS:-2}" --modes plain,auto \
    --workloads "${WORKLOADS:-chat,open_chat,mixed,regenerate,code}" "${args[@]}" \
    > "$out/speculative-$mode.json" 2> /dev/null
  python3 tools/gpu/spec_summary.py "$out/speculative-$mode.json"
done
