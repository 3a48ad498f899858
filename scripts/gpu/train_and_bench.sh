#!/usr/bin/env bash
# GPU session 1 (2 x H200): train the learned package on GPU 0 while GPU 1 measures the enhance stage.
# Usage on the GPU host, from the repo root: bash scripts/gpu/train_and_bench.sh PHOTOS_DIR OUT_DIR MINUTES
set -uo pipefail
PHOTOS=${1:-../shared/data/photos}; OUT=${2:-out}; MINUTES=${3:-7}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpus.txt"
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/gpus.txt"
CUDA_VISIBLE_DEVICES=0 python3 -m training.train --photos "$PHOTOS" --minutes "$MINUTES" --device cuda \
  --out services/pipeline/models/packages/ --seed 0 > "$OUT/train.log" 2>&1 &
TRAIN=$!
CUDA_VISIBLE_DEVICES=1 python3 -m lab.bench.enhance --device cuda:0 --repeats 5 \
  --json "$OUT/bench-enhance-untrained.json" > "$OUT/bench-enhance.log" 2>&1
wait $TRAIN; echo "train exit $?" >> "$OUT/train.log"
# The trained package, measured once more on the idle GPU 1.
CUDA_VISIBLE_DEVICES=1 python3 -m lab.bench.enhance --device cuda:0 --repeats 5 \
  --packages strata_jdd_v1.strata --json "$OUT/bench-enhance.json" >> "$OUT/bench-enhance.log" 2>&1
tar cf "$OUT/artifacts.tar" services/pipeline/models/packages docs/training
tail -n 30 "$OUT/train.log"; cat "$OUT/bench-enhance.log"
