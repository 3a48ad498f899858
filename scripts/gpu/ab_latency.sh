#!/usr/bin/env bash
# GPU host, one call: the latency scenarios on a fresh `strata serve` per setting, the settings alternating for
# ROUNDS rounds (a lease's drift falls on every setting alike), then each setting's warm runs pooled.
# Usage from the repo root: SETS="NAME=VALUE ...;NAME=VALUE ..." bash scripts/gpu/ab_latency.sh OUT [SCENARIOS] [REPEATS] [ROUNDS]
# (SCENARIOS: single; REPEATS 4 a service, the first cold; ROUNDS 2). JSON per service: OUT/r<round>-s<set>.json.
set -uo pipefail
OUT=${1:-out}; SCEN=${2:-single}; REPEATS=${3:-4}; ROUNDS=${4:-2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
IFS=';' read -ra SETS <<< "${SETS:?SETS=\"A=1;A=0\"}"
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!SETS[@]}"; do
    DATA=$(mktemp -d "${DATA_ROOT:-/tmp}/strata-ab-XXXX")
    env ${SETS[$i]} python3 -m cli.main serve --port 8765 --data-dir "$DATA" > "$DATA/serve.log" 2>&1 &
    SERVE=$!
    for _ in $(seq 1 180); do grep -qx "ready" "$DATA/serve.log" && break; kill -0 "$SERVE" 2>/dev/null || break; sleep 1; done
    python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios "$SCEN" --repeats "$REPEATS" \
      --json "$OUT/r$r-s$i.json" > "$OUT/r$r-s$i.txt" 2>&1
    echo "round $r, ${SETS[$i]}:"; grep -E "^(single|stack4|stack8) " "$OUT/r$r-s$i.txt"
    kill "$SERVE"; wait "$SERVE" 2>/dev/null; sleep 2
    mkdir -p "$OUT/.logs/r$r-s$i" && cp -r "$DATA/logs" "$DATA/serve.log" "$OUT/.logs/r$r-s$i/" 2>/dev/null
    rm -rf "$DATA"
  done
done
tar czf "$OUT/logs.tgz" -C "$OUT/.logs" . && rm -rf "$OUT/.logs"  # one file: a call brings back only a few
python3 - "$OUT" "${SETS[@]}" <<'PY'
import json, statistics, sys
from pathlib import Path
out, sets = Path(sys.argv[1]), sys.argv[2:]
pooled = {}
for path in sorted(out.glob("r*-s*.json")):
    s = int(path.stem.split("-s")[1])
    for sc in json.loads(path.read_text())["scenarios"]:
        warm = [r["processing_s"] for r in sc["runs"] if r.get("warm")]
        pooled.setdefault((sc["scenario"], s), []).extend(warm)
print(f"{'scenario':<9} {'setting':<40} {'warm runs':>9} {'median s':>9} {'min-max s':>12}")
for (scenario, s), runs in sorted(pooled.items()):
    print(f"{scenario:<9} {sets[s]:<40} {len(runs):>9} {statistics.median(runs):9.3f} {min(runs):6.2f}-{max(runs):.2f}")
(out / "pooled.json").write_text(json.dumps({f"{sc}|{sets[s]}": v for (sc, s), v in pooled.items()}, indent=1))
PY
