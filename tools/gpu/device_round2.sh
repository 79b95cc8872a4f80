#!/usr/bin/env bash
# The second H200 run of 2026-12-01 (docs/h200/suite-20261201-h5.txt), kept as the record of
# how the float32 activations were measured: on tree 3911d12 plus a switch, H5_F32ACT=1,
# that kernels/ops_mlx.py read then (abdc905 made it the only behaviour and dropped the
# switch, so the variable now changes nothing). What the first run left unfinished or
# failing; prefill and decode speed with and without it (on a quiet machine); then its
# agreement figures and the France prompt beside the tests.
set -u
export PYTHONPATH=/root/site:$PWD
logs=/tmp/logs
rm -rf $logs && mkdir -p $logs/speed
source tools/gpu/device_tests.sh
variants=("H5_F32ACT=0" "H5_F32ACT=1" "BRANCHCHAT_DTYPE=float32")
for model in smollm2-135m; do
  for v in "${variants[@]}"; do
    env $v timeout 60 python3 -m bench decode --model $model --runs 3 --steps 32 --json \
      > $logs/speed/$model-$v.json 2>> $logs/speed/err.txt
  done
done
python3 - $logs/speed <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        d = json.loads(p.read_text())
    except Exception as e:
        print(p.name, "unreadable", e); continue
    ours = d.get("ours") or d.get("results") or d
    print(p.name, json.dumps(ours)[:600])
PY
(
  H5_F32ACT=1 timeout 300 python3 -m bench agreement --paths mlx-default --out "$OUT" \
    > $logs/agreement.txt 2>&1
) &
for v in "${variants[@]}"; do
  env $v timeout 200 python3 -m engine generate --prompt "What is the capital of France?" \
    --temperature 0 --max-tokens 24 --no-prompt-cache > "$logs/paris-$v.txt" 2>&1 &
done
SHARDED="tests/engine/test_models.py tests/oracles/test_real_oracles.py" SHARDS=8 \
  SUITE_BUDGET=${SUITE_BUDGET:-330} run_tests tests/oracles/test_real_oracles.py \
  tests/engine/test_models.py tests/engine/test_gemma3_session.py tests/engine/remote/*.py
wait
cat "$OUT/summary.txt"
for v in "${variants[@]}"; do echo "== France prompt, $v:"; cat "$logs/paris-$v.txt"; done
echo "== agreement:"; cat $logs/agreement.txt
tar -czf "$OUT/round2.tar.gz" -C $logs .
