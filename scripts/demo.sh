#!/usr/bin/env bash
# Install, start the embedded service (SQLite, local storage, private Redis), synthesise an IQ3_S frame and an
# IQ2_XS stack, submit both, print where the TIFFs are, stop the service.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
DATA=${STRATA_DEMO_DIR:-./var/demo}
PORT=${STRATA_DEMO_PORT:-8000}
mkdir -p "$DATA"
strata serve --data-dir "$DATA" --port "$PORT" >"$DATA/serve.log" 2>&1 &
SERVE=$!
trap 'kill -TERM $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  kill -0 $SERVE 2>/dev/null || { cat "$DATA/serve.log"; exit 1; }
  sleep 0.5
done
strata synth --camera IQ3_S --scale 0.1 --out "$DATA/shots/iq3s" >/dev/null
strata synth --camera IQ2_XS --scale 0.1 --frames 4 --out "$DATA/shots/iq2xs" >/dev/null
export STRATA_API_URL="http://127.0.0.1:$PORT"
echo "IQ3_S frame:"
strata submit "$DATA"/shots/iq3s/*.dng --data-dir "$DATA" --out "$DATA/out/iq3s"
echo "IQ2_XS 4-frame stack:"
strata submit "$DATA"/shots/iq2xs/*.dng --stack --data-dir "$DATA" --out "$DATA/out/iq2xs"
echo "TIFFs are in $DATA/out (ground truth beside the shots in $DATA/shots)"
