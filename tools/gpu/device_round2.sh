#!/usr/bin/env bash
# H5 round 2 on the H200 (after unpack.sh's last parcel): what round 1 left unfinished or
# failing, and the float32-activations experiment of kernels/ops_mlx.py (H5_F32ACT=1):
# prefill and decode speed with and without it (quiet machine, interleaved), then its
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
