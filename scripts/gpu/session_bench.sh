#!/usr/bin/env bash
# GPU host, one call: the GPU tile check, then one `strata serve` timed by the service benchmark (the latency
# scenarios with the default recipe, then a batch with a proof per shot), then the preview benchmark.
# Usage from the repo root: bash scripts/gpu/session_bench.sh OUT [BATCH] [REPEATS]
# Plan about 10 minutes of device time for the defaults (80 MP shots are synthesised on the host first).
set -uo pipefail
OUT=${1:-out}; BATCH=${2:-16}; REPEATS=${3:-3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if timeout 120 python3 scripts/gpu/check_tiles.py --json "$OUT/check-tiles.json" > "$OUT/check-tiles.txt" 2>&1; then
  export STRATA_GPU_DEFLATE=true  # the tiles checked out on this host: let the workers compress them
else
  echo "GPU tile check failed: the service runs with the CPU deflate"
fi
cat "$OUT/check-tiles.txt" | tail -12
DATA=$(mktemp -d /tmp/strata-svc-XXXX)
python3 -m cli.main serve --port 8765 --data-dir "$DATA" > "$OUT/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 1 180); do grep -qx "ready" "$OUT/serve.log" && break; kill -0 "$SERVE" 2>/dev/null || break; sleep 1; done
python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios single,stack4,stack8 \
  --repeats "$REPEATS" --json "$OUT/latency.json" 2>&1
python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios single,batch --repeats 2 \
  --batch-size "$BATCH" --recipe tiff16 --recipe jpeg-proof --interactive-during-batch --json "$OUT/batch.json" 2>&1
grep -h -i -E "GPU tile|Traceback|Error" "$DATA"/logs/*.log 2>/dev/null | sort | uniq -c | sort -rn | head -8
kill "$SERVE"; sleep 3
python3 -m lab.bench.preview --scale 1.0 --repeats 6 --out "$OUT/preview.json" 2>&1 | tail -8
