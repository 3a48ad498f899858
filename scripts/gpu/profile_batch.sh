#!/usr/bin/env bash
# GPU host: where a batch's processes spend their time. Runs the batch-only session bench (LATENCY=0) and, once
# the GPU is busy, samples the GPU worker and a coordinator with py-spy for SECONDS: once every thread that runs
# Python, once only the thread that holds the GIL (--gil). The GIL samples over rate x seconds is the fraction of
# the time the process's Python runs at all: near 100 % a process is bound by its GIL, whatever the cores do.
# Usage from the repo root: bash scripts/gpu/profile_batch.sh OUT [BATCH] [SECONDS]  (py-spy installed)
set -uo pipefail
OUT=${1:-out}; BATCH=${2:-24}; SECONDS_=${3:-6}; RATE=100
mkdir -p "$OUT"
LATENCY=0 SINGLE_REPEATS=1 bash scripts/gpu/session_bench.sh "$OUT/bench" "$BATCH" 1 > "$OUT/bench.txt" 2>&1 &
BENCH=$!
for _ in $(seq 1 600); do  # wait for the batch: the GPU busy for a while
  u=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -1)
  grep -q "^single run 0" "$OUT/bench.txt" 2>/dev/null && [ "${u:-0}" -ge 30 ] && sleep 2 && break
  sleep 0.5
done
for name in gpu0 coordinator; do
  pid=$(pgrep -f -- "-n ${name}@" | head -1)
  [ -z "$pid" ] && continue
  py-spy record -p "$pid" -d "$SECONDS_" -r "$RATE" --format raw -o "$OUT/$name-all.txt" --nonblocking > /dev/null 2>&1 &
  py-spy record -p "$pid" -d "$SECONDS_" -r "$RATE" --format raw -o "$OUT/$name-gil.txt" --gil --nonblocking > /dev/null 2>&1 &
done
wait $(jobs -p | grep -v "^$BENCH$") 2>/dev/null
wait "$BENCH"
grep -A2 "^batch " "$OUT/bench.txt" | head -3
for f in "$OUT"/*-gil.txt "$OUT"/*-all.txt; do
  [ -f "$f" ] || continue
  n=$(awk '{s+=$NF} END {print s+0}' "$f")
  echo "$(basename "$f"): $n samples of $((RATE * SECONDS_)) ($(awk -v n="$n" -v t=$((RATE * SECONDS_)) 'BEGIN {printf "%.0f", 100*n/t}') %)"
  # the heaviest leaf functions
  awk '{n=$NF; $NF=""; k=split($0, a, ";"); leaf=a[k]; gsub(/^ +| +$/, "", leaf); c[leaf]+=n} END {for (l in c) print c[l], l}' "$f" \
    | sort -rn | head -12
done
