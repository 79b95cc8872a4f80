#!/usr/bin/env bash
# The engine's own one-launch build at an earlier commit beside the working tree's, in one
# run on one GPU: a source change that no knob switches (session 43's gate_up loop, shared
# by both x layouts) timed against what it replaced, old and new taking turns.
#   here:   bash tools/gpu/tree_ab.sh pack REV      -> .device/ab/REV.tar.gz (git-ignored;
#           the Python packages the probe imports, without the shipped drafter's weights)
#   device: bash tools/gpu/tree_ab.sh run REV [SHAPE...]   carry [".device/ab"], after
#           tools/gpu/unpack.sh's last parcel; SHAPEs default to the Llama-3.2-1B shape
# Each turn is `python -m bench.gpu.step_tuning --engine-with FQ_INT8=0` (the engine's build
# three times: first, the knob at its engine value, last), ROUNDS turns a tree (default 2),
# into $OUT/ab-SHAPE-{old,new}-N.txt; the summary prints each turn's medians.
set -u
what=${1:?usage: tree_ab.sh pack REV | run REV [SHAPE...]}
rev=${2:?a commit}
shift 2
if [ "$what" = pack ]; then
  root=$(git rev-parse --show-toplevel)
  mkdir -p "$root/.device/ab"
  git -C "$root" archive --format=tar "$rev" engine kernels bench setup.py pyproject.toml \
    README.md | tar --delete --wildcards 'engine/drafters/*.safetensors' 2>/dev/null \
    | gzip > "$root/.device/ab/$rev.tar.gz"
  ls -la "$root/.device/ab/$rev.tar.gz"
  exit 0
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
old=/root/ab-$rev
rm -rf "$old" && mkdir -p "$old" && tar -xzf ".device/ab/$rev.tar.gz" -C "$old"
(cd "$old" && python3 setup.py -q build_ext --inplace > /tmp/ab-build.log 2>&1) \
  || tail -5 /tmp/ab-build.log  # its C kernels, as unpack.sh builds the working tree's
source tools/gpu/ahead_with.sh  # shape NAME: the random Q4_K_M weights of a true shape
for big in ${@:-llama-3.2-1b}; do
  shape "$big"
  for n in $(seq "${ROUNDS:-2}"); do
    for side in old new; do
      dir=$PWD
      [ $side = old ] && dir=$old
      (cd "$dir" && PYTHONPATH=/root/site:$dir timeout "${AB_TIMEOUT:-240}" python3 -m \
        bench.gpu.step_tuning --model /root/shapes/$big.gguf --contexts 128 2048 --repeats 30 \
        --engine-with FQ_INT8=0 > "$OUT/ab-$big-$side-$n.txt" 2>&1)
      echo "== $big $side $n: exit $?"
      python3 - "$OUT/ab-$big-$side-$n.txt" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
for r in rows:
    print(r["context"], round(r["decode_ms"], 4), round(r["verify_8_ms"], 4))
PY
    done
  done
done
