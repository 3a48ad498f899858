"""`strata coordinator` / `strata workers` on a host of their own (docs/OPERATIONS.md, "N hosts"; the compose
services): found from outside, both printed their worker names and started nothing (the supervisor was handed the
specs and never started them). Here the real command runs until its coordinator's heartbeat appears in Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path


def _read_lines(proc: subprocess.Popen[bytes], lines: list[bytes]) -> None:
    assert proc.stdout is not None
    lines.extend(iter(proc.stdout.readline, b""))


def test_strata_coordinator_starts_its_workers(tmp_path: Path, redis_url: str) -> None:
    from workers.registry import live_workers, redis_client

    node = f"cmd-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "STRATA_REDIS_URL": redis_url, "STRATA_NODE_NAME": node, "STRATA_COORDINATORS": "1",
           "STRATA_EXPRESS_COORDINATORS": "0", "STRATA_WORKER_HEARTBEAT_S": "1", "STRATA_RECONCILE_INTERVAL_S": "0",
           "STRATA_ADMISSION_INTERVAL_S": "0", "STRATA_RETENTION_INTERVAL_S": "0", "PYTHONUNBUFFERED": "1",
           "STRATA_DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'strata.db'}"}  # not an earlier test's
    cli = [sys.executable, "-m", "cli.main"]
    waiting = f"coordinator@{node} waits for its database: not migrated (no Strata tables): run `strata db upgrade`"
    waits = subprocess.Popen([*cli, "coordinator", "--data-dir", str(tmp_path / "var")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[bytes] = []
    reader = threading.Thread(target=_read_lines, args=(waits, lines), daemon=True)
    reader.start()
    try:
        # An unmigrated database: not ready (found from outside: it was, and failed every pass). It says it waits
        # after its quiet time (10 s of waiting, services/db/schema.py): still no heartbeat by then.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and waits.poll() is None and waiting.encode() not in b"".join(lines):
            time.sleep(0.2)
        ready = [w for w in live_workers(redis_client(redis_url)) if w.name.endswith(node)]
    finally:
        os.killpg(waits.pid, signal.SIGTERM)
        waits.wait(timeout=60)
        reader.join(timeout=60)
    said = b"".join(lines).decode(errors="replace")
    assert not ready, said[-3000:]
    assert waiting in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    # SIGTERM ends the wait: it said "Warm shutdown" and waited on until the supervisor's SIGKILL (20 s later)
    assert "did not stop within" not in said, said[-3000:]
    subprocess.run([*cli, "db", "upgrade", "--data-dir", str(tmp_path / "var")], env=env, check=True, timeout=120)
    proc = subprocess.Popen([*cli, "coordinator", "--data-dir", str(tmp_path / "var")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            seen = [w.name for w in live_workers(redis_client(redis_url), "coordinator") if w.name.endswith(node)]
            if seen:
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert seen == [f"coordinator@{node}"], out.decode(errors="replace")[-3000:]


def test_strata_workers_refuses_gpus_cuda_cannot_see(tmp_path: Path) -> None:
    """Found from outside: `strata workers --gpus 0` on a host without a GPU said "ready" and rendered on the CPU."""
    import torch

    if torch.cuda.is_available():
        return  # a GPU host: the refusal is for hosts without one
    got = subprocess.run([sys.executable, "-m", "cli.main", "workers", "--gpus", "0", "--data-dir",
                          str(tmp_path / "var")], capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "GPU(s) 0 asked for (--gpus / STRATA_GPU_ID) but CUDA sees 0 on this host" in " ".join(got.stderr.split())
