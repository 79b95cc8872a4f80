#!/usr/bin/env bash
# On the lent H200: grow the drafter's training data in the background while other calls
# use the machine (device_train.sh's GROW step, TRAIN=0), then bring back what it made.
# The data then travels to the next session, whose calls only train (--init: a warm start
# from the shipped file) and measure.
#
#   carry [".device/drafter/carry"]  (self_prompts.npz and seqs.npz of the shipped drafter's
#   run; the model already joined, e.g. by device_bench.sh's JOIN_ONLY call):
#       GROW=16000 bash tools/drafter/device_grow.sh start MINUTES
#   any later call on the same warm machine:
#       bash tools/drafter/device_grow.sh collect
#
# `start` copies the working tree to /root/grow/tree (a later call's tree replaces this
# one's) and returns at once; the work stops by itself after MINUTES. `collect` puts under
# $OUT the finished files (more_prompts.npz, grown.npz), the unfinished chunks (state.tgz:
# carry them back in .device/drafter/carry with self_prompts.npz and seqs.npz, and the
# next device_train.sh call with the same GROW goes on from there) and the log; it waits
# for nothing and may run while the work goes on.
set -euo pipefail
root=/root/grow
case "${1:?usage: device_grow.sh start MINUTES | collect}" in
  start)
    minutes=${2:?usage: device_grow.sh start MINUTES}
    gguf=$HOME/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$gguf" ] || { echo "the model is not joined on this machine" >&2; exit 1; }
    [ -f .device/drafter/carry/seqs.npz ] || { echo "carry .device/drafter/carry" >&2; exit 1; }
    rm -rf "$root" && mkdir -p "$root/out" "$root/state"
    git ls-files -z | tar --null -T - -cf - | (mkdir -p "$root/tree" && tar -xf - -C "$root/tree")
    cp .device/drafter/carry/*.npz "$root/state/"
    cd "$root/tree"
    (OUT=$root/out TRAIN=0 GROW=${GROW:?GROW=N more prompts} setsid nohup bash \
      tools/drafter/device_train.sh "$gguf" "$minutes" "$root/state" > "$root/log" 2>&1 &)
    sleep 5
    cat "$root/log"
    ;;
  collect)
    out=${OUT:?OUT must name the folder whose files come back}
    for f in more_prompts.npz grown.npz; do
      if [ -f "$root/state/$f" ]; then cp "$root/state/$f" "$out/"; fi
    done
    unfinished=""
    for d in more_prompts more_gen; do
      if [ -d "$root/state/$d" ]; then unfinished="$unfinished $d"; fi
    done
    # shellcheck disable=SC2086
    if [ -n "$unfinished" ]; then (cd "$root/state" && tar -czf "$out/state.tgz" $unfinished); fi
    cp "$root/log" "$out/grow.log"
    pgrep -f device_train.sh > /dev/null && echo "still running" || echo "finished"
    tail -n 15 "$root/log"
    ls -la "$out"
    ;;
esac
