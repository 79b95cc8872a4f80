# Sourced by the device steps: run one bench with a time budget, JSON to $OUT.
export PYTHONPATH=/root/site:$PWD
run() {
  local name=$1
  shift
  timeout "${BUDGET:-170}" python3 -m bench "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$?"
  tail -3 "$OUT/$name.err"
}
