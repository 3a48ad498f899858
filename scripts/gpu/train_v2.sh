#!/usr/bin/env bash
# GPU host (one H200): train the `best` package, strata_jdd_v2, in two device calls (a call lasts 10 minutes).
#   part 1 (carry .photos, a copy of ../shared/data/photos): pick the largest network config within the GPU
#          budget (scripts/gpu/pick_v2_config.py), train for STOP minutes of a MINUTES-minute schedule, save a
#          checkpoint (to /tmp/v2 and to OUT).
#   part 2 (next call, the machine still warm; carry .whlA to install the service's wheels meanwhile): resume,
#          finish, evaluate (held-out photographs, dead leaves, scikit-image photographs), time an 80 MP enhance,
#          write the package and the log into OUT. On a fresh machine it takes .photos and .ckpt/ckpt.pt instead.
# Usage from the repo root: bash scripts/gpu/train_v2.sh 1|2 OUT
set -uo pipefail
PART=$1; OUT=$2
export PYTHONUNBUFFERED=1
W=/tmp/v2
mkdir -p "$W/log" "$W/pkg" "$W/photos" "$OUT"
[ -n "$(ls "$W/photos" 2>/dev/null)" ] || cp .photos/*.png "$W/photos/"
ARGS="--package v2 --photos $W/photos --device cuda --log-dir $W/log --out $W/pkg --checkpoint $W/ckpt.pt"
if [ "$PART" = 1 ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 scripts/gpu/pick_v2_config.py --budget "${BUDGET:-0.33}" --json "$OUT/pick.json" > "$W/cfg" || exit 1
  cat "$W/cfg"
  python3 -m training.train $ARGS $(cat "$W/cfg") --minutes "${MINUTES:-15}" --stop-after "${STOP:-7.6}" \
    --eval-every 4000 2>&1 | grep -v "^.*step [0-9]*/[0-9]* lr" | tail -30
  cp "$W/ckpt.pt" "$W/cfg" "$W/log/"* "$OUT/"
else
  if [ -d .whlA ]; then
    (python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whlA/*.whl > "$W/pip.log" 2>&1; echo "wheels installed: $?" >> "$W/pip.log") &
  fi
  [ -f "$W/ckpt.pt" ] || cp .ckpt/ckpt.pt .ckpt/cfg "$W/"
  python3 -m training.train $ARGS $(cat "$W/cfg") --resume "$W/ckpt.pt" --eval-every 4000 2>&1 \
    | grep -v "step [0-9]*/[0-9]* lr" | tail -40
  wait
  cat "$W/pip.log" 2>/dev/null | tail -2
  cp "$W/pkg/"* "$W/log/"* "$OUT/"
fi
ls -la "$OUT"
