#!/usr/bin/env bash
# Every `run` carries the whole working tree beside its parcel (41.5 MB on 2026-12-07,
# tests/ and engine/drafters/ most of it), yet the staging calls of pack.sh's parcels read
# only tools/gpu/unpack.sh and what the C kernel's build needs (setup.py, kernels/).
#   bash tools/gpu/slim_tree.sh on     move the folders no staging call reads out of the
#                                      checkout (to $SLIM_HOLD, default /tmp/branchchat-slim)
#   bash tools/gpu/slim_tree.sh off    put them back, before the first call that tests or times
#   bash tools/gpu/slim_tree.sh size   the parcel size a slim tree allows: 64 MiB less the
#                                      tracked files left, less 4 MB
# Session 45: PARCEL_BYTES=$(bash tools/gpu/slim_tree.sh size) PACK_MODELS=smollm2 bash
# tools/gpu/pack.sh cut the wheels and the default model into four 58 MB parcels, where the
# whole tree left 21 MB ones (eleven calls). `on` refuses where a folder it moves holds
# changes git does not have: should the hold be lost, `git checkout -- .` restores the rest.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
hold=${SLIM_HOLD:-/tmp/branchchat-slim}
moved=(tests docs bench app engine/drafters)
cd "$root"
case "${1:?usage: slim_tree.sh on|off|size}" in
on)
  if [ -n "$(git status --porcelain -- "${moved[@]}")" ]; then
    echo "slim_tree: uncommitted changes under ${moved[*]}: commit them first" >&2
    exit 1
  fi
  [ ! -e "$hold" ] || { echo "slim_tree: $hold exists: run 'off' first" >&2; exit 1; }
  for path in "${moved[@]}"; do mkdir -p "$hold/$(dirname "$path")" && mv "$path" "$hold/$path"; done
  echo "moved aside: ${moved[*]}"
  ;;
off)
  for path in "${moved[@]}"; do
    [ -e "$hold/$path" ] || continue
    if [ -e "$path" ]; then  # mv would nest the held folder inside it; rm -rf would lose it
      echo "slim_tree: $path is back already (git checkout?): $hold/$path kept" >&2
      exit 1
    fi
    mv "$hold/$path" "$path"
  done
  rm -rf "$hold"
  git status --short | head
  ;;
size)
  kept=$(git ls-files -z -- . "${moved[@]/#/:!}" | xargs -0 du -cb | tail -1 | cut -f1)
  echo $(((64 << 20) - kept - (4 << 20)))
  ;;
*) echo "usage: slim_tree.sh on|off|size" >&2; exit 2 ;;
esac
