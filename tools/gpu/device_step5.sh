#!/usr/bin/env bash
# Step 5 on the H200 (no carry): mlx-lm beside ours, the edit, verify and rollback benches.
set -u
source tools/gpu/device_run.sh
BUDGET=240 run decode_peers decode --peers --runs 2 --steps 64 --mlx-lm-runs 2
run edit edit --runs 3
run verify verify --runs 5
BUDGET=200 run rollback rollback
ls -la "$OUT"
