#!/usr/bin/env bash
# Sourced by the device scripts: run_tests FILE... runs each test file as its own pytest, 12
# at a time in the given order, the files named in $SHARDED split by test into $SHARDS
# parts (their tests take minutes each on the GPU), all stopped at $SUITE_BUDGET seconds.
# BLAS and OpenMP get 2 threads a process: 12 processes of 16 spinning threads on 16 cores
# ran the numpy tests many times slower. Logs in $logs/tests; the totals in $OUT/summary.txt.
SHARDED=${SHARDED:-"tests/oracles/test_real_oracles.py tests/engine/test_models.py tests/kernels/test_mixed_concat.py tests/engine/test_fused_decode.py tests/engine/test_hybrid.py tests/engine/test_convert.py"}
SHARDS=${SHARDS:-8}
run_tests() {
  mkdir -p $logs/tests $logs/units /tmp/pt
  : > $logs/files.txt
  : > $logs/order.txt
  local f name
  for f in "$@"; do
    echo "$f" >> $logs/files.txt
    name=$(echo "$f" | tr / _)
    if grep -q -w -F "$f" <<< "$SHARDED"; then
      python3 -m pytest --collect-only -q -p no:cacheprovider "$f" 2>/dev/null | grep "::" \
        | awk -v n="$SHARDS" -v base="$logs/units/$name" '{print > (base "@" NR % n)}'
      ls $logs/units | grep -F "$name@" >> $logs/order.txt
    else
      echo "$f" > "$logs/units/$name" && echo "$name" >> $logs/order.txt
    fi
  done
  export deadline=$(($(date +%s) + ${SUITE_BUDGET:-430})) logs OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
  # SIGINT at the deadline: a unit cut short still prints pytest's summary of failures; a
  # unit not started by then is not started (suite_summary.py lists both)
  xargs -P 12 -a $logs/order.txt -I{} bash -c 'left=$((deadline - $(date +%s)))
    [ $left -gt 10 ] || exit 0
    timeout -s INT -k 20 $left python3 -m pytest -q -p no:cacheprovider -rfE --durations=3 \
      --basetemp=/tmp/pt/{} @$logs/units/{} > $logs/tests/{}.log 2>&1'
  python3 tools/gpu/suite_summary.py $logs/tests $logs/files.txt > "$OUT/summary.txt"
}
