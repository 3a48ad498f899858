#!/usr/bin/env bash
# GPU session: speed benchmarks on 2 x H200 (enhance stage, pipeline 1 vs 2 GPUs), the stack quality bench and
# the stack exactness check (group counts, strips) on the GPU.
# Usage on the GPU host, from the repo root: bash scripts/gpu/bench.sh OUT_DIR
set -uo pipefail
OUT=${1:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
timeout 150 python3 -m lab.bench.enhance --device cuda:0 --repeats 5 \
  --packages classical_v1.strata,strata_jdd_v1.strata --json "$OUT/bench-enhance.json" > "$OUT/bench-enhance.log" 2>&1
timeout 330 python3 -m lab.bench.pipeline --devices cuda:0,cuda:1 --scale 1.0 --frames 8 \
  --json "$OUT/bench-pipeline.json" > "$OUT/bench-pipeline.log" 2>&1
timeout 90 python3 -m lab.quality.stack_bench --device cuda:0 --scale 0.2 \
  --json "$OUT/stack-bench.json" > "$OUT/stack-bench.log" 2>&1
timeout 120 python3 scripts/gpu/check_stack.py --device cuda:0 --scale 0.2 > "$OUT/check-stack.log" 2>&1
cat "$OUT/bench-enhance.log" "$OUT/bench-pipeline.log"; tail -n 30 "$OUT/stack-bench.log"; cat "$OUT/check-stack.log"
