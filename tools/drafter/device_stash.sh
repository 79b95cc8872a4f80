#!/usr/bin/env bash
# On the H200: keep one carried part of stage_model.sh in /root/stash/drafter, where
# device_train.sh joins the model from.   bash tools/drafter/device_stash.sh .device/drafter/pK
set -eu
parcel=${1:?usage: bash tools/drafter/device_stash.sh .device/drafter/pK}
mkdir -p /root/stash/drafter
cp "$parcel"/* /root/stash/drafter/
ls -la /root/stash/drafter
