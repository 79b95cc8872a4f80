#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel and the model joined): the next
# round after session 27's H100 figures. The drafter's one-launch pass on a context from
# past position 0 (rows rotated at their slots since), a pool whose rounds lookup alone
# drafts keeping its queued steps (block mode lost 17% on a fresh question without it),
# then greedy speculation with the block drafter out of Auto and in it
# (BRANCHCHAT_AUTO_BLOCK), the queue fix under both. Each part has its own limit, so a cut
# run still returns the earlier parts' files.      bash tools/drafter/fused_round.sh
# (RUNS: runs a mode, default 2; WORKLOADS: the speculative part's; AUTO_BLOCKS: the
# BRANCHCHAT_AUTO_BLOCK values to run, default "0 1"; TESTS=0 skips the tests, so a second
# call can take the second value within one call's limit)
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
[ "${TESTS:-1}" = 0 ] || timeout -s INT 240 python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/engine/test_block_pass_fused.py tests/engine/test_launch_ahead_pool.py \
  tests/engine/test_drafter_pool.py tests/engine/test_match_acceptance.py \
  tests/engine/test_launch_ahead.py > "$out/fused-round-tests.txt" 2>&1
[ "${TESTS:-1}" = 0 ] || { grep -E "^(FAILED|ERROR)" "$out/fused-round-tests.txt" | cut -c1-300
  tail -1 "$out/fused-round-tests.txt"; }
workloads=${WORKLOADS:-chat,open_chat,mixed,regenerate,code}
for a in ${AUTO_BLOCKS:-0 1}; do
  BRANCHCHAT_AUTO_BLOCK=$a timeout 240 python3 -m bench speculative --json --runs "${RUNS:-2}" \
    --modes plain,auto,block --workloads "$workloads" > "$out/speculative-auto-block$a.json" \
    2> /dev/null
done
python3 - "$out" ${AUTO_BLOCKS:-0 1} <<'PY'
import json, sys
for a in sys.argv[2:]:
    try:
        r = json.load(open(f"{sys.argv[1]}/speculative-auto-block{a}.json"))
    except (OSError, ValueError) as e:
        print(f"auto_block={a}: no figures ({e})")
        continue
    print(f"auto_block={a}", "pass ms", r.get("block_pass_ms"))
    for w, x in r["workloads"].items():
        print(" ", w, x["plain_tok_s"]["median"], "identical", x["identical"],
              {m: (x[m]["speedup"], x[m]["drafted"]) for m in ("auto", "block") if m in x})
PY
