#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel, the default model joined): the
# test files named (the whole suite's failures, fixed) and sampled decoding queued and not,
# three runs each after an untimed one that compiles the device draw's graphs.
#     bash tools/gpu/rerun_round.sh tests/engine/test_x.py ...
set -u
cd "$(dirname "$0")/../.."
out=${OUT:?OUT must name the folder whose files come back}
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider -rfE "$@" > "$out/rerun-tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$out/rerun-tests.txt" | cut -c1-300
tail -1 "$out/rerun-tests.txt"
sampled="--modes plain --workloads chat --temperature 0.7 --top-p 0.95 --seed 0"
timeout 120 python3 -m bench speculative --json --runs 1 $sampled --max-tokens 16 > /dev/null 2>&1
for q in 1 0; do
  BRANCHCHAT_QUEUE_STEPS=$q timeout 90 python3 -m bench speculative --json --runs 3 $sampled \
    > "$out/sampled-runs3-queue$q.json" 2> /dev/null
  python3 -c "import json,sys; print('queue $q', json.load(open(sys.argv[1]))['workloads']['chat']['plain_tok_s'])" \
    "$out/sampled-runs3-queue$q.json"
done
