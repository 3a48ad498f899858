#!/usr/bin/env bash
# GPU host: start the whole service (strata serve: API, coordinator, one worker per GPU, private Redis, SQLite,
# local storage) and time shots through it with `strata bench service`.
# Usage from the repo root: bash scripts/gpu/service_bench.sh OUT_DIR [extra bench args]
set -uo pipefail
OUT=${1:-out}; shift || true
mkdir -p "$OUT"
DATA=$(mktemp -d /tmp/strata-svc-XXXX)
python3 -m cli.main serve --port 8765 --data-dir "$DATA" > "$OUT/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 1 120); do grep -qx "ready" "$OUT/serve.log" && break; kill -0 "$SERVE" 2>/dev/null || break; sleep 1; done
python3 -m cli.main bench service --json "$OUT/bench-service.json" "$@" 2>&1 | tee "$OUT/bench-service.log"
kill "$SERVE"; sleep 5
cp -r "$DATA/logs" "$OUT/service-logs" 2>/dev/null || true
rm -rf "$DATA"
