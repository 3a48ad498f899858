#!/usr/bin/env bash
# GPU host, one call: the encode probe, the preview benchmark, then the service benchmark (latency scenarios and
# a batch with a proof per shot) through `strata serve`. Usage: bash scripts/gpu/session_bench.sh OUT [BATCH]
set -uo pipefail
OUT=${1:-out}; BATCH=${2:-16}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 scripts/gpu/encode_probe.py --scale 1.0 --threads "$(nproc)" --json "$OUT/encode-probe.json" 2>&1 | tee "$OUT/encode-probe.txt"
python3 -m lab.bench.preview --scale 1.0 --repeats 10 --out "$OUT/preview.json" 2>&1 | tail -15
bash scripts/gpu/service_bench.sh "$OUT/lat" --scale 1.0 --scenarios single,stack4,stack8 --repeats 4
python3 - "$OUT/lat/bench-service.json" <<'PY' || true
import json, sys; print(json.dumps(json.load(open(sys.argv[1])), indent=None)[:3000])
PY
bash scripts/gpu/service_bench.sh "$OUT/batch" --scale 1.0 --scenarios single,batch --repeats 2 \
  --batch-size "$BATCH" --recipe tiff16 --recipe jpeg-proof --interactive-during-batch
tail -5 "$OUT/batch/serve.log"
