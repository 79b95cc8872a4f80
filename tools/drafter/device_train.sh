#!/usr/bin/env bash
# The drafter's training on the lent H200 (a call runs 10 minutes at most), recipe 2
# (README.md): prompts the target writes itself, then its replies to them and to the
# hand-built prompts, then training with distillation, resumed call after call. Every
# step is resumable: a call does what is left within MINUTES, and what it could not
# finish the next call continues (on this machine from STATE; on a fresh one from the
# files an earlier call returned, carried back as .device/drafter/carry/).
#
#   bash tools/drafter/device_train.sh GGUF MINUTES [STATE]
#
#   GGUF     the target, SmolLM2-135M-Instruct.Q4_1.gguf; when missing it is joined from
#            the parts tools/drafter/stage_model.sh cut (stashed by device_stash.sh, the
#            last one carried in this call) and checked against their sha256
#   MINUTES  the work's wall-clock budget in this call, all steps together (leave ~1 of
#            the 10 minutes for loading and returning)
#   STATE    kept between calls while the machine stays warm (default /root/drafter)
#
# Environment (defaults in brackets):
#   PROMPTS [20000]   self-written prompts to sample; 0: the hand-built prompts only
#   PASSES  ["1 1"]   replies per hand-built prompt, per self-written prompt
#   PATIENCE [8]      evaluations (every 200 steps) without a better eval_chat that stop training
#   TRAIN    [1]      0: stop after generation (no training, no export)
#   GROW     [0]      N: after the carried self_prompts.npz and seqs.npz, N more prompts the
#            target writes (seed GROW_SEED [1], none repeating a carried one), one reply
#            each, merged into grown.npz, which training then reads; with TRAIN_ARGS="--init
#            engine/drafters/<the shipped file>" the run starts from the shipped weights
#   PROMPT_ARGS, GEN_ARGS, TRAIN_ARGS: more arguments for `prompts`, `generate`, `train`
#            (train's settings only count on a fresh run: a resumed one keeps its own)
# Back under $OUT (8 files at most, 16 MiB each): state.tgz (the prompt or reply chunks
# while that step is unfinished), self_prompts.npz, seqs.npz, (GROW) more_prompts.npz and
# grown.npz, log.jsonl, steps.log and
# block_drafter.safetensors (+ .sha256) of the best eval_chat checkpoint. On a fresh
# machine put the returned self_prompts.npz, seqs.npz and state.tgz in .device/drafter/carry
# and carry that folder (with the model's last part).
set -euo pipefail
usage="usage: device_train.sh GGUF MINUTES [STATE]"
gguf=${1:?$usage}
minutes=${2:?$usage}
state=${3:-/root/drafter}
out=${OUT:?OUT must name the folder whose files come back}
cd "$(dirname "$0")/../.."
mkdir -p "$state" "$out"
export PYTHONUNBUFFERED=1
train="python3 -m tools.drafter.train"
budget=$(python3 -c "print(int(float('$minutes') * 60))")
# minutes left in the budget, less $1 (never 0: the steps read --minutes 0 as no limit)
left() { python3 -c "print(max(0.01, ($budget - $SECONDS) / 60 - ${1:-0}))"; }
has_time() { python3 -c "import sys; sys.exit(0 if $budget - $SECONDS > ${1:-20} else 1)"; }

if [ ! -f "$gguf" ]; then  # join the parts of stage_model.sh
  mkdir -p /root/stash/drafter "$(dirname "$gguf")"
  for part in .device/drafter/p*/model.part.* .device/drafter/p*/model.sha256; do
    if [ -f "$part" ]; then cp "$part" /root/stash/drafter/; fi
  done
  cat /root/stash/drafter/model.part.* > "$gguf"
  echo "$(cat /root/stash/drafter/model.sha256)  $gguf" | sha256sum -c
fi
gguf=$(realpath "$gguf")
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c 'import torch, transformers, tokenizers, jinja2; print(torch.__version__, transformers.__version__, tokenizers.__version__)'

pack() {  # what a fresh machine needs to go on, and the logs
  made="self_prompts.npz seqs.npz"  # (GROW: those came from here; the new ones go back)
  if [ "${GROW:-0}" -gt 0 ]; then made="more_prompts.npz grown.npz"; fi
  for f in $made run/log.jsonl; do
    if [ -f "$state/$f" ]; then cp "$state/$f" "$out/"; fi
  done
  unfinished=""
  if [ ! -f "$state/self_prompts.npz" ] && [ -d "$state/prompts" ]; then unfinished=prompts; fi
  if [ -d "$state/gen" ] && [ ! -f "$state/seqs.npz" ]; then unfinished="$unfinished gen"; fi
  if [ ! -f "$state/more_prompts.npz" ] && [ -d "$state/more_prompts" ]; then
    unfinished="$unfinished more_prompts"
  fi
  if [ -d "$state/more_gen" ] && [ ! -f "$state/grown.npz" ]; then
    unfinished="$unfinished more_gen"
  fi
  if [ -n "$unfinished" ]; then
    # shellcheck disable=SC2086
    (cd "$state" && tar -czf "$out/state.tgz" $unfinished) || true
  fi
  ls -la "$out"
}
trap pack EXIT

# an earlier call's returned files, carried back on a fresh machine (in this call, or
# stashed by an earlier one: device_stash.sh .device/drafter/carry)
for carry in .device/drafter/carry /root/stash/drafter; do
  for f in self_prompts.npz seqs.npz more_prompts.npz grown.npz; do
    if [ -f "$carry/$f" ] && [ ! -f "$state/$f" ]; then cp "$carry/$f" "$state/$f"; fi
  done
  if [ -f "$carry/state.tgz" ]; then
    tar -xzf "$carry/state.tgz" -C "$state" --skip-old-files
  fi
done
if [ -f tools/drafter/seqs.npz ] && [ ! -f "$state/seqs.npz" ]; then
  cp tools/drafter/seqs.npz "$state/"  # recipe 1's way: a carried sequences file
fi

prompt_files=tools/drafter/prompts.npz
if [ "${PROMPTS:-20000}" -gt 0 ]; then
  if [ ! -f "$state/self_prompts.npz" ] && [ ! -f "$state/seqs.npz" ] && has_time 30; then
    # shellcheck disable=SC2086  # PROMPT_ARGS is a list of arguments
    $train prompts --model "$gguf" --count "${PROMPTS:-20000}" --state "$state/prompts" \
      --out "$state/self_prompts.npz" --minutes "$(left)" ${PROMPT_ARGS:-} 2>&1 \
      | tee -a "$out/steps.log"
  fi
  [ -f "$state/self_prompts.npz" ] || [ -f "$state/seqs.npz" ] || exit 0  # next call goes on
  prompt_files="$prompt_files $state/self_prompts.npz"
fi
if [ ! -f "$state/seqs.npz" ]; then
  has_time 30 || exit 0
  # shellcheck disable=SC2086
  $train generate --model "$gguf" --prompts $prompt_files --passes ${PASSES:-1 1} \
    --state "$state/gen" --out "$state/seqs.partial.npz" --minutes "$(left)" ${GEN_ARGS:-} 2>&1 \
    | tee -a "$out/steps.log"
  [ -f "$state/seqs.partial.npz" ] || exit 0  # unfinished: the next call goes on
  mv "$state/seqs.partial.npz" "$state/seqs.npz"
fi
data=$state/seqs.npz
if [ "${GROW:-0}" -gt 0 ]; then  # more prompts and their replies, after the carried ones
  grow_seed=${GROW_SEED:-1}
  if [ ! -f "$state/grown.npz" ]; then
    if [ ! -f "$state/more_prompts.npz" ]; then
      has_time 30 || exit 0
      # shellcheck disable=SC2086
      $train prompts --model "$gguf" --count "$GROW" --seed "$grow_seed" \
        --avoid "$state/self_prompts.npz" --state "$state/more_prompts" \
        --out "$state/more_prompts.npz" --minutes "$(left)" ${PROMPT_ARGS:-} 2>&1 \
        | tee -a "$out/steps.log"
      [ -f "$state/more_prompts.npz" ] || exit 0
    fi
    has_time 30 || exit 0
    # the earlier files with no new replies, so the new replies' prompt indices follow theirs
    # shellcheck disable=SC2086
    $train generate --model "$gguf" --prompts $prompt_files "$state/more_prompts.npz" \
      --passes 0 0 1 --seed "$grow_seed" --state "$state/more_gen" \
      --out "$state/more_seqs.npz" --minutes "$(left)" ${GEN_ARGS:-} 2>&1 | tee -a "$out/steps.log"
    [ -f "$state/more_seqs.npz" ] || exit 0
    $train merge --data "$state/seqs.npz" "$state/more_seqs.npz" --out "$state/grown.npz" \
      | tee -a "$out/steps.log"
  fi
  data=$state/grown.npz
fi
[ "${TRAIN:-1}" = 1 ] || exit 0
has_time 90 || exit 0  # loading and one evaluation need about a minute
# shellcheck disable=SC2086
$train train --model "$gguf" --data "$data" --out "$state/run" --resume \
  --minutes "$(left 0.75)" --patience "${PATIENCE:-8}" ${TRAIN_ARGS:-} 2>&1 \
  | tee -a "$out/steps.log"
best=$([ -f "$state/run/best.pt" ] && echo --best || true)
$train export --model "$gguf" --out "$state/run" --file "$out/block_drafter.safetensors" $best \
  2>&1 | tee -a "$out/steps.log"
