"""Two coordinators, one SIGKILLed while it ingests a job: the survivor takes the job over (its supervisor hands the
dead one's leases back, the survivor's reconciler re-sends the ingest, the survivor runs it) and the output is
byte-identical to a fault-free render. The dead coordinator is not restarted here, so only the survivor can have
finished the job. Outcomes only: how fast is measured by `strata chaos` (docs/OPERATIONS.md)."""

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

INGEST_DELAY_S = 4.0  # failure drill: every ingest pauses after marking the job running, a window for the kill


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
    from workers.launcher import ProcSpec, Supervisor, free_port, lease_releaser, worker_specs

    root = tmp_path_factory.mktemp("failover")
    url = backend_url(BACKENDS[0], root)
    base, _, db_number = redis_url.rpartition("/")
    n = int(db_number or 0)
    own_redis = f"{base}/{n + 3 if n + 3 < 16 else n - 1}"  # apart from the other e2e modules' (+1, +2), in 0-15
    redis.Redis.from_url(own_redis).flushdb()
    env = {"STRATA_DATABASE_URL": url, "STRATA_DATA_DIR": str(root / "var"), "STRATA_REDIS_URL": own_redis,
           "STRATA_COORDINATORS": "2", "STRATA_CPU_WORKERS": "1", "STRATA_TORCH_THREADS": "1",
           "STRATA_FAULT_INGEST_DELAY_S": str(INGEST_DELAY_S), "STRATA_WORKER_HEARTBEAT_S": "1",
           "STRATA_MIGRATE_ON_START": "false", "STRATA_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    configure(url, root / "var")
    reset_database(url)
    with session_scope() as session:
        token = create_station_token(session, "failover")
    saved_env = dict(os.environ)
    os.environ.update(env)
    get_settings.cache_clear()
    port = free_port()
    specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                              "127.0.0.1", "--port", str(port), "--log-level", "warning"])]
    specs += worker_specs(get_settings())
    assert [s.name.split("@")[0] for s in specs if s.env.get("STRATA_WORKER_KIND") == "coordinator"] == [
        "coordinator", "coordinator2", "coordinator-express"]
    # No restarts: a killed coordinator stays dead, so whatever finishes its job is the other one.
    sup = Supervisor(specs, env=env, log_dir=root / "logs", restart=False, on_exit=lease_releaser(get_settings()))
    sup.start()
    stop = threading.Event()

    def supervise() -> None:  # what run_forever does: notice dead children (hand back their leases)
        while not stop.wait(0.5):
            sup.poll()

    threading.Thread(target=supervise, daemon=True).start()
    base_url = f"http://127.0.0.1:{port}"
    ready: dict = {}
    for _ in range(240):
        try:
            r = httpx.get(f"{base_url}/readyz", timeout=2)
            ready = r.json()
            if r.status_code == 200 and ready["workers"].get("coordinator", 0) >= 2:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        stop.set()
        sup.stop()
        logs = "\n".join(p.read_text()[-2000:] for p in (root / "logs").glob("*.log"))
        pytest.fail(f"service did not become ready: {ready}\n{logs}")
    yield Service(base_url, {"Authorization": f"Bearer {token}"}, sup, own_redis)
    stop.set()
    sup.stop()
    restore_environment(saved_env)


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("shot")
    done = subprocess.run([sys.executable, "-m", "cli.main", "synth", "--camera", "IQ3_S", "--out", str(out),
                           "--scale", "0.05", "--noise", "0.0005", "--seed", "21"],
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


def _holder(service: Service, job_id: str, timeout: float = 60) -> str:
    """The coordinator whose heartbeat holds ``job_id`` (its lease), as `GET /v1/workers` shows it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = httpx.get(f"{service.url}/v1/workers", headers=service.headers, timeout=10).json()["workers"]
        for w in workers:
            if w["kind"] == "coordinator" and job_id in w["jobs"]:
                assert w["busy"]
                return str(w["name"])
        time.sleep(0.05)
    pytest.fail(f"no coordinator was seen holding job {job_id}")


def test_a_second_coordinator_takes_over_an_ingest_whose_coordinator_was_killed(service: Service,
                                                                               shot: list[Path]) -> None:
    from workers.registry import live_workers, redis_client

    reference = _wait(service, _submit(service, shot))
    assert reference["status"] == "done", reference["error"]

    job_id = _submit(service, shot)
    victim = _holder(service, job_id)
    job = httpx.get(f"{service.url}/v1/jobs/{job_id}", headers=service.headers, timeout=30).json()
    assert (job["status"], job["stage"]) == ("running", "decoding")  # killed mid-ingest, in the drill's pause
    info = {w.name: w for w in live_workers(redis_client(service.redis_url))}[victim]
    os.kill(info.pid, signal.SIGKILL)  # no chance to clean up, release its lease or acknowledge

    job = _wait(service, job_id)
    assert job["status"] == "done", job["error"]
    coordinators = [w for w in live_workers(redis_client(service.redis_url), "coordinator")]
    assert [w.name for w in coordinators] != [] and victim not in {w.name for w in coordinators}
    assert [o["sha256"] for o in job["outputs"]] == [o["sha256"] for o in reference["outputs"]]
