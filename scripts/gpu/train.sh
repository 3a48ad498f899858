#!/usr/bin/env bash
# GPU session: train the learned package on one H200 (GPU 0) and measure it on the enhance stage afterwards.
# Usage on the GPU host, from the repo root: bash scripts/gpu/train.sh PHOTOS_DIR OUT_DIR MINUTES [STEPS]
set -uo pipefail
PHOTOS=${1:-../shared/data/photos}; OUT=${2:-out}; MINUTES=${3:-7}; STEPS=${4:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpus.txt"
CUDA_VISIBLE_DEVICES=0 python3 -m training.train --photos "$PHOTOS" --minutes "$MINUTES" ${STEPS:+--steps "$STEPS"} --device cuda \
  --out services/pipeline/models/packages/ --seed 0 > "$OUT/train.log" 2>&1
echo "train exit $?" >> "$OUT/train.log"
CUDA_VISIBLE_DEVICES=0 python3 -m lab.bench.enhance --device cuda:0 --repeats 5 \
  --packages strata_jdd_v1.strata --json "$OUT/bench-enhance.json" > "$OUT/bench-enhance.log" 2>&1
tar cf "$OUT/artifacts.tar" services/pipeline/models/packages docs/training
tail -n 25 "$OUT/train.log"; cat "$OUT/bench-enhance.log"
