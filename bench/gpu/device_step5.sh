#!/usr/bin/env bash
# Step 5 on the H200 (no carry): the speculative and edit benches on the default model.
set -u
source bench/gpu/device_run.sh
run speculative speculative --runs 3
run edit edit --runs 3
ls -la "$OUT"
