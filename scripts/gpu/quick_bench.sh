#!/usr/bin/env bash
# GPU host, a short call: `strata serve`, the idle IQ3_S latency (6 runs), then 24 shots + proof with an interactive
# shot during them; prints the TIFF writes' split. Usage from the repo root: OUT=dir bash scripts/gpu/quick_bench.sh
# (PYTHONPATH must reach the installed wheels; about 2 minutes).
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1; mkdir -p "$OUT"
DATA=$(mktemp -d /tmp/strata-svc-XXXX)
python3 -m cli.main serve --port 8765 --data-dir "$DATA" > $OUT/serve.log 2>&1 &
S=$!
for _ in $(seq 1 120); do grep -qx ready $OUT/serve.log && break; sleep 1; done
python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios single --repeats 6 --json $OUT/latency.json 2>&1 | grep -E "^single  |run [0-9]|^    " | tail -14
timeout 100 python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios single,batch --repeats 2 --batch-size 24 --recipe tiff16 --recipe jpeg-proof --interactive-during-batch --json $OUT/batch.json 2>&1 | grep -E "^batch  |interactive during|^       CPU core-s"
grep -h "MB encoded and written in" "$DATA"/logs/*.log | grep "\.tif" | sed -E 's/.*written in ([0-9.]+)s, durable ([0-9.]+)s later, hashed ([0-9.]+)s.*/\1\/\2\/\3/' | tr '\n' ' '; echo
tar czf $OUT/logs.tgz -C "$DATA" logs
kill $S
