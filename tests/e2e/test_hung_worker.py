"""The only GPU worker stopped with SIGSTOP while it computes a shard (alive, its connections open, but silent: what
a process stuck in a call that never lets its heartbeat thread run looks like): its supervisor sees the worker's own
heartbeat stop, SIGKILLs it after STRATA_WORKER_HUNG_AFTER_S and restarts it; the shard it held is computed by the
new process and the job finishes, its output byte-identical to a fault-free render. Found from outside: before, the
stopped worker was never restarted, its shard was re-dispatched to a queue that only it read, and the job waited
for good. Outcomes only, within bounded waits: how fast is not asserted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import BACKENDS, backend_url, configure, reset_database, restore_environment

pytestmark = pytest.mark.e2e

SHARD_DELAY_S = 3.0  # failure drill: every shard pauses before it computes, a window to stop its worker
HUNG_AFTER_S = 8.0  # well above a loaded 2-core host's longest gap between beats (measured: about 1 beat)


@dataclass
class Service:
    url: str
    headers: dict[str, str]
    supervisor: object
    redis_url: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Service]:
    import redis

    from services.config import get_settings
    from services.db.session import session_scope
    from services.stations import create_station_token
    from workers.launcher import ProcSpec, Supervisor, free_port, hang_watch, lease_releaser, worker_specs

    root = tmp_path_factory.mktemp("hung")
    url = backend_url(BACKENDS[0], root)
    redis.Redis.from_url(redis_url).flushdb()  # no stale message reaches these workers
    env = {"STRATA_DATABASE_URL": url, "STRATA_DATA_DIR": str(root / "var"), "STRATA_REDIS_URL": redis_url,
           "STRATA_COORDINATORS": "1", "STRATA_EXPRESS_COORDINATORS": "0", "STRATA_CPU_WORKERS": "1",
           "STRATA_TORCH_THREADS": "1", "STRATA_FAULT_SHARD_DELAY_S": str(SHARD_DELAY_S),
           "STRATA_WORKER_HEARTBEAT_S": "1", "STRATA_WORKER_HUNG_AFTER_S": str(HUNG_AFTER_S),
           "STRATA_MIGRATE_ON_START": "false", "STRATA_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    configure(url, root / "var")
    reset_database(url)
    with session_scope() as session:
        token = create_station_token(session, "hung")
    saved_env = dict(os.environ)
    os.environ.update(env)
    get_settings.cache_clear()
    port = free_port()
    specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                              "127.0.0.1", "--port", str(port), "--log-level", "warning"])]
    specs += worker_specs(get_settings())
    assert [s.name.split("@")[0] for s in specs if s.env.get("STRATA_WORKER_KIND") == "gpu"] == ["cpu0"]
    sup = Supervisor(specs, env=env, log_dir=root / "logs", on_exit=lease_releaser(get_settings()),
                     hang_check=hang_watch(get_settings()))  # as `strata serve` and `strata workers` have it
    sup.start()
    stop = threading.Event()

    def supervise() -> None:  # what run_forever does
        while not stop.wait(0.5):
            sup.poll()

    threading.Thread(target=supervise, daemon=True).start()
    base_url = f"http://127.0.0.1:{port}"
    ready: dict = {}
    for _ in range(240):
        try:
            r = httpx.get(f"{base_url}/readyz", timeout=2)
            ready = r.json()
            if r.status_code == 200 and ready["workers"].get("gpu", 0) >= 1:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        stop.set()
        sup.stop()
        logs = "\n".join(p.read_text()[-2000:] for p in (root / "logs").glob("*.log"))
        pytest.fail(f"service did not become ready: {ready}\n{logs}")
    yield Service(base_url, {"Authorization": f"Bearer {token}"}, sup, redis_url)
    stop.set()
    sup.stop(timeout=10)
    restore_environment(saved_env)


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("shot")
    done = subprocess.run([sys.executable, "-m", "cli.main", "synth", "--camera", "IQ3_S", "--out", str(out),
                           "--scale", "0.05", "--noise", "0.0005", "--seed", "23"],
                          capture_output=True, text=True, check=True)
    return [Path(line) for line in done.stdout.split() if line.endswith(".dng")]


def _submit(service: Service, files: list[Path]) -> str:
    r = httpx.post(f"{service.url}/v1/jobs", headers=service.headers, timeout=60,
                   files=[("frames", (p.name, p.read_bytes())) for p in files])
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _wait(service: Service, job_id: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{service.url}/v1/jobs/{job_id}", headers=service.headers, timeout=30).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.2)
    pytest.fail(f"job {job_id} did not finish: {job}")


def _computing(service: Service, timeout: float = 60) -> tuple[str, int, tuple[int, ...]]:
    """The GPU worker computing a shard now: (name, pid, shards), from its heartbeat."""
    from workers.registry import live_workers, redis_client

    client = redis_client(service.redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [w for w in live_workers(client, "gpu") if w.shards]
        if busy:
            return busy[0].name, busy[0].pid, busy[0].shards
        time.sleep(0.05)
    pytest.fail("no GPU worker was seen computing a shard")


def test_a_stopped_worker_is_killed_and_restarted_and_its_shard_finishes(service: Service, shot: list[Path]) -> None:
    from sqlalchemy import select

    from services.db.models import Shard
    from services.db.session import session_scope

    reference = _wait(service, _submit(service, shot))
    assert reference["status"] == "done", reference["error"]

    job_id = _submit(service, shot)
    name, pid, held = _computing(service)
    os.kill(pid, signal.SIGSTOP)  # alive and connected, but silent: never acknowledges, never beats
    try:
        job = _wait(service, job_id)
    finally:
        if os.path.exists(f"/proc/{pid}"):  # not killed (the test failed): let the supervisor's stop end it
            os.kill(pid, signal.SIGCONT)
    assert job["status"] == "done", job["error"]
    assert [o["sha256"] for o in job["outputs"]] == [o["sha256"] for o in reference["outputs"]]
    assert not os.path.exists(f"/proc/{pid}")  # SIGKILLed and reaped by its supervisor
    restarted = service.supervisor.procs[name]  # type: ignore[attr-defined]
    assert restarted.pid != pid and restarted.poll() is None
    with session_scope() as session:
        shards = session.scalars(select(Shard).where(Shard.job_id == job_id)).all()
    assert set(held) <= {s.id for s in shards} and all(s.status == "done" for s in shards)
