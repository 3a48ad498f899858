#!/usr/bin/env bash
# GPU host, one call: the preview benchmark, the disk's durable write speed, then one `strata serve` timed
# by the service benchmark (the latency scenarios, then a batch with a proof per shot and an interactive shot during
# it), on the default STRATA_GPU_DEFLATE (on: every job's TIFF tiles compressed on the GPU where nvCOMP is
# installed). CHECK_TILES=1 first runs the GPU tile check (the service falls back to off where it fails), then runs
# the same batch again with the tiles off (A/B) unless BOTH=0.
# FAST=1 also times the latency scenarios with the fast model tier (recipe tiff16-fast) on the same service;
# TILES_AB=1 then serves again with STRATA_GPU_DEFLATE=batch (interactive shots' tiles on the CPU) for the latency.
# BATCH_RECIPE (tiff16) is the batch's main recipe (tiff16-fast: the fast model tier).
# DATA_ROOT (/tmp) holds the services' data dirs (/dev/shm: no disk under the storage, an A/B of the disk).
# LATENCY=0 skips the preview benchmark and the latency scenarios (a batch-only run), PREVIEW=0 the preview
# benchmark only, a BATCH of 0 the batch (a latency-only run); SINGLE_REPEATS (4) is the number of idle IQ3_S runs
# timed before each batch.
# AB="NAME=VALUE ..." then runs the batch again on a service started with those settings (an A/B on one lease);
# several sets separated by ";" run one after the other (batch-ab.json, batch-ab-1.json, ...).
# AHEAD=1 uploads each batch's shots ahead into a batch whose window opens after the uploads (`--upload-ahead`: the
# render alone is timed, not sharing the disk with the uploads); CLEAN=1 removes each service's data dir once it
# stopped (a 60-shot batch leaves about 32 GB: two on a 64 GB disk do not fit); REMOVE=1 removes each batch job's
# files once it is done (`--remove-files`: a 100-shot batch on the 64 GB disk). INTERACTIVE (5) interactive shots are
# timed one after another during each batch (the median is reported; it was one shot before session 24).
# Usage from the repo root: bash scripts/gpu/session_bench.sh OUT [BATCH] [REPEATS]
# Plan about 6-8 minutes of device time for the defaults (80 MP shots are synthesised on the host first).
set -uo pipefail
OUT=${1:-out}; BATCH=${2:-16}; REPEATS=${3:-3}; BOTH=${BOTH:-1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
TILES=${STRATA_GPU_DEFLATE:-on}  # the default; CHECK_TILES=1 checks the tiles first (off where they fail)
if [ "${CHECK_TILES:-0}" = 1 ]; then
  if ! timeout 150 python3 scripts/gpu/check_tiles.py --json "$OUT/check-tiles.json" > "$OUT/check-tiles.txt" 2>&1; then
    TILES=off
    echo "GPU tile check failed: the service runs with the CPU deflate"
  fi
  tail -12 "$OUT/check-tiles.txt"
fi
[ "${LATENCY:-1}" = 1 ] && [ "${PREVIEW:-1}" = 1 ] && python3 -m lab.bench.preview --scale 1.0 --repeats 8 --out "$OUT/preview.json" 2>&1 | tail -12
echo "durable write, 2 GiB:"; dd if=/dev/zero of=/tmp/strata-dd bs=4M count=512 conv=fsync 2>&1 | tail -1; rm -f /tmp/strata-dd
serve() {  # serve DATA LOG: start `strata serve` on DATA and wait for it
  env ${SERVE_ENV:-} python3 -m cli.main serve --port 8765 --data-dir "$1" > "$2" 2>&1 &  # env execs: $! is serve
  SERVE=$!
  for _ in $(seq 1 180); do grep -qx "ready" "$2" && break; kill -0 "$SERVE" 2>/dev/null || break; sleep 1; done
}
stop() { kill "$SERVE"; wait "$SERVE" 2>/dev/null; sleep 2; [ "${CLEAN:-0}" = 1 ] && rm -rf "${DATA:-}" "${DATA2:-}" "${DATA3:-}" "${DATA4:-}"; true; }
AHEAD_FLAG="$([ "${AHEAD:-0}" = 1 ] && echo --upload-ahead) $([ "${REMOVE:-0}" = 1 ] && echo --remove-files)"
DATA=$(mktemp -d "${DATA_ROOT:-/tmp}/strata-svc-XXXX")
STRATA_GPU_DEFLATE=$TILES serve "$DATA" "$OUT/serve.log"
echo "service with STRATA_GPU_DEFLATE=$TILES"
[ "${LATENCY:-1}" = 1 ] && python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 \
  --scenarios single,stack4,stack8 --repeats "$REPEATS" --json "$OUT/latency.json" 2>&1
[ "$BATCH" != 0 ] && python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios single,batch --repeats "${SINGLE_REPEATS:-4}" \
  --batch-size "$BATCH" --recipe "${BATCH_RECIPE:-tiff16}" --recipe jpeg-proof --interactive-during-batch --interactive-shots "${INTERACTIVE:-5}" $AHEAD_FLAG --json "$OUT/batch.json" 2>&1
if [ "${FAST:-0}" = 1 ]; then
  echo "latency with the fast tier (recipe tiff16-fast)"
  python3 -m cli.main bench service --data-dir "$DATA" --scale 1.0 --scenarios single,stack4,stack8 \
    --repeats "$REPEATS" --recipe tiff16-fast --json "$OUT/latency-fast.json" 2>&1
fi
timeout 120 python3 scripts/gpu/verify_outputs.py "$DATA" 2>&1 | tail -8  # GPU- and CPU-compressed TIFFs: same pixels
grep -h -i -E "fast preview in|GPU tile|Traceback|Error" "$DATA"/logs/*.log 2>/dev/null | sed -E 's/^[0-9-]+ [0-9:,]+ //' \
  | sed -E 's/job [0-9a-f]+/job J/; s/[0-9]\.[0-9]+s/N.NNs/' | sort | uniq -c | sort -rn | head -8
summary() {  # summary DATA SUFFIX: the stage figures from one service's logs, its logs as OUT/logsSUFFIX.tgz
  grep -h "fast preview in" "$1"/logs/*.log | grep -o "in [0-9.]*s" | tr '\n' ' '; echo
  echo "finalize (outputs written and recorded / final preview / intermediates removed, s):"
  grep -h "outputs written and recorded in" "$1"/logs/*.log \
    | sed -E 's/.*recorded in ([0-9.]+)s; final preview ([0-9.]+)s, intermediates removed ([0-9.]+)s.*/\1\/\2\/\3/' \
    | tr '\n' ' '; echo
  tar czf "$OUT/logs$2.tgz" -C "$1" logs 2>/dev/null  # one file: a call brings back only a few
  echo "TIFF writes (encode+write / durable close / rest of the hash, s):"
  grep -h "MB encoded and written in" "$1"/logs/*.log | grep "\.tif" \
    | sed -E 's/.*written in ([0-9.]+)s, durable ([0-9.]+)s later, hashed ([0-9.]+)s.*/\1\/\2\/\3/' | tr '\n' ' '; echo
  echo "TIFFs the GPU worker wrote from its tiles (written / durable close, s):"
  grep -h "written from the device's tiles in" "$1"/logs/*.log \
    | sed -E 's/.*tiles in ([0-9.]+)s, durable ([0-9.]+)s later.*/\1\/\2/' | tr '\n' ' '; echo
  echo "TIFF layouts of GPU tiles (s):"
  grep -h ": laid out (" "$1"/logs/*.log | grep -o "in [0-9.]*s" | sed -E 's/in |s$//g' | tr '\n' ' '; echo
  echo "finalize: record and commit (s):"
  grep -h "the record and commit" "$1"/logs/*.log | grep -o "commit [0-9.]*s" | sed -E 's/commit |s$//g' | tr '\n' ' '; echo
  echo "batch TIFF writes that yielded to interactive shots (count, seconds in all):"
  grep -h "yielded to interactive" "$1"/logs/*.log | grep -o "; [0-9.]*s of it" | grep -v "; 0.00s" \
    | grep -o "[0-9.]*" | awk '{n++; s+=$1} END {printf "%d %.2f\n", n, s}'
  echo "proofs derived (resize, sharpen, 8-bit; s):"
  grep -h ": derived (long edge" "$1"/logs/*.log | grep -o "in [0-9.]*s" | sed -E 's/in |s$//g' | tr '\n' ' '; echo
  echo "strips (render+download / of which bins+tiles on the device / bins+tiles stored / waiting for a device slot / paused for interactive shards, s):"
  for lane in interactive batch; do
    echo -n "$lane: "
    grep -h "rendered and downloaded in" "$1"/logs/*.log | if [ $lane = interactive ]; then grep "(interactive)"; else grep -v "(interactive)"; fi \
    | sed -E 's/.*downloaded in ([0-9.]+)s .*device slot ([0-9.]+)s, .*device ([0-9.]+)s, paused for interactive shards ([0-9.]+)s\), .*stored in ([0-9.]+)s.*/\1\/\3\/\5\/\2\/\4/' \
    | tr '\n' ' '; echo
  done
  grep -h "ingested:" "$1"/logs/*.log | grep -o "decoded in [0-9.]*s, planned in [0-9.]*s" | sed -E 's/decoded in |planned in //g' \
    | tr '\n' ' '; echo
}
summary "$DATA" ""
stop
if [ "${TILES_AB:-0}" = 1 ]; then
  DATA3=$(mktemp -d "${DATA_ROOT:-/tmp}/strata-svc-XXXX")
  STRATA_GPU_DEFLATE=batch serve "$DATA3" "$DATA3/serve.log"
  echo "latency with STRATA_GPU_DEFLATE=batch"
  python3 -m cli.main bench service --data-dir "$DATA3" --scale 1.0 --scenarios single --repeats "$((REPEATS * 2))" \
    --json "$OUT/latency-tiles-batch.json" 2>&1
  stop
fi
IFS=';' read -ra SETS <<< "${AB:-}"  # AB="NAME=VALUE ...[;NAME=VALUE ...]": the batch again on a service per set
for i in "${!SETS[@]}"; do
  DATA4=$(mktemp -d "${DATA_ROOT:-/tmp}/strata-svc-XXXX")
  SERVE_ENV=${SETS[$i]} serve "$DATA4" "$DATA4/serve.log"
  echo "service with ${SETS[$i]}"
  python3 -m cli.main bench service --data-dir "$DATA4" --scale 1.0 --scenarios single,batch --repeats "${SINGLE_REPEATS:-4}" \
    --batch-size "$BATCH" --recipe "${BATCH_RECIPE:-tiff16}" --recipe jpeg-proof --interactive-during-batch --interactive-shots "${INTERACTIVE:-5}" $AHEAD_FLAG \
    --json "$OUT/batch-ab$([ "$i" = 0 ] || echo "-$i").json" 2>&1
  summary "$DATA4" "-ab$([ "$i" = 0 ] || echo "-$i")"
  stop
done
if [ "${CHECK_TILES:-0}" = 1 ] && [ "$BOTH" = 1 ] && [ "$TILES" != off ]; then
  DATA2=$(mktemp -d "${DATA_ROOT:-/tmp}/strata-svc-XXXX")
  STRATA_GPU_DEFLATE=off serve "$DATA2" "$DATA2/serve.log"
  echo "service with STRATA_GPU_DEFLATE=off"
  python3 -m cli.main bench service --data-dir "$DATA2" --scale 1.0 --scenarios single,batch --repeats "${SINGLE_REPEATS:-4}" \
    --batch-size "$BATCH" --recipe "${BATCH_RECIPE:-tiff16}" --recipe jpeg-proof --interactive-during-batch --interactive-shots "${INTERACTIVE:-5}" $AHEAD_FLAG \
    --json "$OUT/batch-cpu-deflate.json" 2>&1
  stop
fi
