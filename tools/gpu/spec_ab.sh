#!/usr/bin/env bash
# `python -m bench speculative` with the engine at an earlier commit beside the working
# tree's, in one run on one GPU, the two taking turns: a decode-loop change that no knob
# switches (session 46's draft verified behind the step queued on its pending token) timed
# against what it replaced, on the workloads it moves.
#   here:   bash tools/gpu/tree_ab.sh pack REV      -> .device/ab/REV.tar.gz
#   device: bash tools/gpu/spec_ab.sh REV   carry [".device/ab"], after tools/gpu/unpack.sh's
#           last parcel (the default model in place)
# SPEC_ARGS: bench speculative's (default: 2 runs of plain and Auto on chat, open chat,
# regenerate and code); ROUNDS turns a tree (default 1), each into $OUT/spec-{new,old}-N.json;
# the summary prints each turn's speedups, acceptance and drafted tokens.
set -u
rev=${1:?usage: spec_ab.sh REV}
export PYTHONUNBUFFERED=1
old=/root/ab-$rev
if [ ! -d "$old/engine" ]; then
  mkdir -p "$old" && tar -xzf ".device/ab/$rev.tar.gz" -C "$old"
  (cd "$old" && python3 setup.py -q build_ext --inplace > /tmp/ab-build.log 2>&1) \
    || tail -5 /tmp/ab-build.log  # its C kernels, as unpack.sh builds the working tree's
fi
args=${SPEC_ARGS:---runs 2 --modes plain,auto --workloads chat,open_chat,regenerate,code}
for n in $(seq "${ROUNDS:-1}"); do
  for side in new old; do
    dir=$PWD
    [ $side = old ] && dir=$old
    # shellcheck disable=SC2086  # the arguments split as given
    (cd "$dir" && PYTHONPATH=/root/site:$dir timeout "${AB_TIMEOUT:-280}" python3 -m bench \
      speculative --json $args > "$OUT/spec-$side-$n.json" 2> "$OUT/spec-$side-$n.err")
    echo "== $side $n: exit $?"
    python3 tools/gpu/spec_summary.py "$OUT/spec-$side-$n.json"
  done
done
