#!/usr/bin/env bash
# GPU host: the stack frame group's package pass per STRATA_MERGE_PRECISION (PRECISIONS, default float32 bfloat16
# float16), for speed (profile_stack.py, 8 x 50 MP) and
# quality (strata bench stack, scale 0.1, mid noise, 4 and 8 frames).
# Usage from the repo root: bash scripts/gpu/merge_precision.sh OUT [PHOTOS]   (PHOTOS: a folder with 033.png, 036.png)
set -uo pipefail
OUT=${1:-out}; PHOTOS=${2:-}
mkdir -p "$OUT"
CONTENT=(--content dead_leaves)
[ -n "$PHOTOS" ] && CONTENT+=(--content photo:033 --content photo:036 --photos "$PHOTOS")
for p in ${PRECISIONS:-float32 bfloat16 float16}; do
  echo "== STRATA_MERGE_PRECISION=$p"
  STRATA_MERGE_PRECISION=$p timeout 150 python3 scripts/gpu/profile_stack.py --device cuda:0 --scale 1.0 --frames 8 \
    2>&1 | grep -E "prepare_reference|demosaic|align_frame|merge_frame_group"
  STRATA_MERGE_PRECISION=$p timeout 200 python3 -m cli.main bench stack --scale 0.1 --device cuda:0 --noise 0.002 \
    "${CONTENT[@]}" --case "4 frames" --case "8 frames" --json "$OUT/stack-$p.json" 2>&1 | tail -12
done
