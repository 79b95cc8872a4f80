#!/usr/bin/env bash
# Sourced by a GPU round's script, from the project root, after tools/gpu/unpack.sh's last
# parcel: $out (the folder whose files come back), the installed MLX on the path, the
# default model's file as $gguf, and the kernel builds compiled once, untimed. Their first
# compile (nvrtc) takes over a minute for the step's decode and verify builds on a fresh
# machine, and MLX keeps them on disk after, so no timed part of the round is cut by its
# limit while compiling (session 25's second round lost every figure so).
out=${OUT:?OUT must name the folder whose files come back}
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
gguf=$HOME/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 400 python3 -m bench speculative --json --runs 1 --modes plain,auto --workloads code \
  --max-tokens 24 > /dev/null 2>&1 || echo "warm-up: rc $?"

# Greedy speculation (plain and Auto, one run) with a build knob at each value given:
# $out/NAME-spec-VALUE.json, and a line of speedups each.   knob_speculation KNOB WORKLOADS NAME VALUE...
knob_speculation() {
  local knob=$1 workloads=$2 name=$3
  shift 3
  for v in "$@"; do
    BRANCHCHAT_STEP_TUNING=$knob=$v timeout 150 python3 -m bench speculative --json --runs 1 \
      --modes plain,auto --workloads "$workloads" > "$out/$name-spec-$v.json" 2> "$out/$name-spec-$v.err"
  done
  python3 - "$out" "$name" "$@" <<'PY'
import json, sys
folder, name, values = sys.argv[1], sys.argv[2], sys.argv[3:]
for v in values:
    try:
        r = json.load(open(f"{folder}/{name}-spec-{v}.json"))
        print(name, v, {w: {m: (x[m].get("speedup") or x[m].get("median")) for m in x
                            if isinstance(x[m], dict)} for w, x in r["workloads"].items()})
    except (OSError, ValueError, KeyError) as e:
        print(name, v, "no figures:", e)
PY
}
