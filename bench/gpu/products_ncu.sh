#!/usr/bin/env bash
# Nsight Compute on bench/gpu/products_probe.cu: what bounds the step's dot products when they
# run alone. The engine's build, FQ_WIDE's two slices and x in int8 with 32 weights a lane
# (PROBE_INT8 2, bench/gpu/products_int8.cuh), each profiled on three matrices
# (the 8B's gate_up and Q4 down, the 1B's Q6_K head: launch 8 of each matrix's 176).
#   bash bench/gpu/products_ncu.sh [OUT_DIR]      (default $OUT, else /tmp)
set -u
out=${1:-${OUT:-/tmp}}
export PATH=/usr/local/cuda/bin:$PATH
command -v ncu || { echo "no ncu on this machine"; exit 1; }
variants=(
  "narrow:-DFQ_STREAM=1"
  "wide2:-DFQ_STREAM=1 -DFQ_SWIZZLE=1 -DFQ_WIDE=2048 -DFQ_WIDE_SLICES=2"
  "i8w:-DPROBE_INT8=2"
)
source bench/gpu/only_variants.sh
for v in "${variants[@]}"; do
  nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -I kernels/cuda ${v#*:} \
    bench/gpu/products_probe.cu -o "/tmp/ncu-${v%%:*}" > "/tmp/ncu-${v%%:*}.build" 2>&1 &
done
wait
sections="--section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for v in "${variants[@]}"; do
  name=${v%%:*}
  for at in 8b.gate_up:360 8b.down.q4:536 1b.head.q6:1240; do
    file="$out/ncu-$name-${at%%:*}.txt"
    timeout 120 ncu --launch-skip "${at##*:}" --launch-count 1 $sections "/tmp/ncu-$name" \
      > "$file" 2>&1
    echo "== $name ${at%%:*}: exit $?"
    grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Registers Per \
Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Block Limit Shared|\
Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued)" "$file" \
      | sed 's/  */ /g'
    grep -E "^ +(OPT|WRN|INF) " "$file" | cut -c1-240 | head -4
  done
done
