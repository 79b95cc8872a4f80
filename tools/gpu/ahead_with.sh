# Sourced by tools/gpu/wide_round.sh and int8_round.sh. `shape NAME` writes the random
# Q4_K_M weights of a true shape once (/root/shapes); `ahead_with NAME WITH KNOB...` times
# each of $AHEAD_SHAPES (default the Llama-3.2-1B and 3.1-8B shapes): the step and an 8-row
# verify of the engine's build (first and last) beside WITH's builds (bench/gpu/
# step_tuning.py --engine-with), into $OUT/NAME-<shape>.{json,txt}, and prints each row with
# the KNOBs' values.
shape() {
  [ -f /root/shapes/$1.gguf ] || timeout 200 python3 -m bench shapes write --shape $1 \
    --out /root/shapes > /dev/null
}
ahead_with() {
  local name=$1 with=$2
  shift 2
  for big in ${AHEAD_SHAPES:-llama-3.2-1b llama-3.1-8b}; do
    shape $big
    timeout "${AHEAD_TIMEOUT:-280}" python3 -m bench.gpu.step_tuning \
      --model /root/shapes/$big.gguf --contexts 128 2048 --repeats 30 \
      --engine-with "$with" --out "$OUT/$name-$big.json" > "$OUT/$name-$big.txt" 2>&1
    echo "== ahead $big: exit $?"; grep -v "^{" "$OUT/$name-$big.txt" | tail -3
    python3 - "$OUT/$name-$big.txt" "$@" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        knobs = [r["tuning"][k] for k in sys.argv[2:]]
        print(r["context"], knobs, {k: v for k, v in r.items() if k not in ("context", "tuning")})
PY
  done
}
