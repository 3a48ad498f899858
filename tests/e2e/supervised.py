"""A service run as `strata serve` runs it, in the test process's supervisor (API, coordinators, CPU workers), for
the e2e modules that kill or stop its processes; and the shots, uploads and waits they share."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import BACKENDS, backend_url, configure, reset_database, restore_environment


@dataclass
class Service:
    url: str
    headers: dict[str, str]
    supervisor: object
    redis_url: str


def wait_ready(base_url: str, ready_when: Callable[[dict], bool]) -> dict | None:
    """None once /readyz answers 200 and ``ready_when`` its workers; else the last answer (after 120 s)."""
    ready: dict = {}
    for _ in range(240):
        try:
            r = httpx.get(f"{base_url}/readyz", timeout=2)
            ready = r.json()
            if r.status_code == 200 and ready_when(ready["workers"]):
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return ready


@contextmanager
def supervised_service(root: Path, redis_url: str, env: dict[str, str], ready_when: Callable[[dict], bool],
                       check_specs: Callable[[list], None] = lambda specs: None, *, hang_check: bool = False,
                       **supervisor: object) -> Iterator[Service]:
    """The API and :func:`~workers.launcher.worker_specs` of ``env`` (on top of a fresh SQLite database under
    ``root``, Redis ``redis_url`` flushed first) under a Supervisor polled as ``run_forever`` polls it
    (``supervisor``: its further arguments; ``hang_check``: the hang watch of ``env``'s settings, as `strata serve`
    has it); yields once ``ready_when(readyz workers)``."""
    import redis

    from services.config import get_settings
    from services.db.session import session_scope
    from services.stations import create_station_token
    from workers.launcher import ProcSpec, Supervisor, free_port, hang_watch, lease_releaser, worker_specs

    url = backend_url(BACKENDS[0], root)
    redis.Redis.from_url(redis_url).flushdb()  # no stale message reaches these workers
    env = {"STRATA_DATABASE_URL": url, "STRATA_DATA_DIR": str(root / "var"), "STRATA_REDIS_URL": redis_url,
           "STRATA_TORCH_THREADS": "1", "STRATA_WORKER_HEARTBEAT_S": "1", "STRATA_MIGRATE_ON_START": "false",
           "STRATA_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1", **env}
    configure(url, root / "var")
    reset_database(url)
    with session_scope() as session:
        token = create_station_token(session, root.name)
    saved_env = dict(os.environ)
    os.environ.update(env)
    get_settings.cache_clear()
    port = free_port()
    specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                              "127.0.0.1", "--port", str(port), "--log-level", "warning"])]
    specs += worker_specs(get_settings())
    check_specs(specs)
    if hang_check:
        supervisor["hang_check"] = hang_watch(get_settings())
    sup = Supervisor(specs, env=env, log_dir=root / "logs", on_exit=lease_releaser(get_settings()),
                     **supervisor)  # type: ignore[arg-type]
    sup.start()
    stop = threading.Event()

    def supervise() -> None:  # what run_forever does: notice dead (and hung) children, restart them
        while not stop.wait(0.5):
            sup.poll()

    threading.Thread(target=supervise, daemon=True).start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        if (ready := wait_ready(base_url, ready_when)) is not None:
            logs = "\n".join(p.read_text()[-2000:] for p in (root / "logs").glob("*.log"))
            pytest.fail(f"service did not become ready: {ready}\n{logs}")
        yield Service(base_url, {"Authorization": f"Bearer {token}"}, sup, redis_url)
    finally:
        stop.set()
        sup.stop(timeout=10)
        restore_environment(saved_env)


def synth_shot(out: Path, seed: int, camera: str = "IQ3_S", frames: int | None = None) -> list[Path]:
    """A small shot (scale 0.05, low noise): what `strata synth --camera CAMERA --scale 0.05 --noise 0.0005 --seed
    SEED [--frames N]` writes, byte for byte, made in this process (no interpreter to start and import)."""
    from lab.synth.synth import synthesize_shot

    return list(synthesize_shot(camera, out, scale=0.05, frames=frames, seed=seed, noise=0.0005).files)


def submit(service: Service, files: list[Path]) -> str:
    r = httpx.post(f"{service.url}/v1/jobs", headers=service.headers, timeout=60,
                   files=[("frames", (p.name, p.read_bytes())) for p in files])
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def wait(service: Service, job_id: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{service.url}/v1/jobs/{job_id}", headers=service.headers, timeout=30).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.2)
    pytest.fail(f"job {job_id} did not finish: {job}")
