"""Two "hosts" on one machine through object storage: an API, host A (coordinator + a CPU worker) and host B (a
CPU worker), each with its own STRATA_NODE_NAME, data folder and scratch cache; nothing shared on disk, every
array through an S3 bucket (moto in server mode on loopback), truth in the database, ids through Redis."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import PG_URL, S3Server, backend_url, configure, reset_database
from tests.e2e.supervised import synth_shot, wait_ready

pytestmark = pytest.mark.e2e

SHARD_DELAY_S = 0.4  # every shard pauses: a host can be killed mid-shard
VISIBILITY_S = 6


@dataclass
class Hosts:
    url: str
    headers: dict[str, str]
    redis_url: str
    root: Path
    storage_url: str


def _host_env(root: Path, node: str) -> dict[str, str]:
    return {"STRATA_NODE_NAME": node, "STRATA_DATA_DIR": str(root / node), "STRATA_SCRATCH_DIR":
            str(root / node / "scratch")}


def _specs(root: Path) -> tuple[int, list]:  # type: ignore[type-arg]
    from services.config import Settings
    from workers.launcher import ProcSpec, free_port, worker_specs

    port = free_port()
    specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                              "127.0.0.1", "--port", str(port), "--log-level", "warning"], _host_env(root, "api"))]
    for node, coordinator in (("hosta", True), ("hostb", False)):  # host A: one coordinator (no express one)
        settings = Settings(node_name=node, cpu_workers=1, coordinators=1, express_coordinators=0)
        for spec in worker_specs(settings, coordinator=coordinator):
            specs.append(ProcSpec(spec.name, spec.argv, {**spec.env, **_host_env(root, node)}))
    return port, specs


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_server: S3Server) -> Iterator[Hosts]:
    import redis

    from services.db.session import session_scope
    from services.stations import create_station_token
    from workers.launcher import Supervisor

    root = tmp_path_factory.mktemp("two-hosts")
    db_url = backend_url("postgresql" if PG_URL else "sqlite", root)
    base, _, db_number = redis_url.rpartition("/")
    e2e_redis = f"{base}/{int(db_number or 0) + 2}"  # beside the other e2e module's database
    redis.Redis.from_url(e2e_redis).flushdb()
    storage_url = f"s3://strata-{uuid.uuid4().hex[:8]}/studio"
    env = {"STRATA_DATABASE_URL": db_url, "STRATA_REDIS_URL": e2e_redis, "STRATA_STORAGE_URL": storage_url,
           "STRATA_S3_CREATE_BUCKET": "true", "STRATA_TORCH_THREADS": "1",
           "STRATA_FAULT_SHARD_DELAY_S": str(SHARD_DELAY_S), "STRATA_STRIP_ROWS": "96",
           "STRATA_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S), "STRATA_WORKER_HEARTBEAT_S": "1",
           "STRATA_MIGRATE_ON_START": "false", "STRATA_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1", **s3_server.env}
    configure(db_url, root / "test")
    reset_database(db_url)
    with session_scope() as session:
        token = create_station_token(session, "two-hosts")
    port, specs = _specs(root)
    sup = Supervisor(specs, env=env, log_dir=root / "logs")
    sup.start()
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, sup, root)
    yield Hosts(url, {"Authorization": f"Bearer {token}"}, e2e_redis, root, storage_url)
    sup.stop()


def _wait_ready(url: str, sup: object, root: Path) -> None:
    ready = wait_ready(url, lambda workers: workers.get("gpu", 0) >= 2)
    if ready is None:
        return
    sup.stop()  # type: ignore[attr-defined]
    logs = "\n".join(p.read_text()[-2000:] for p in (root / "logs").glob("*.log"))
    pytest.fail(f"service did not become ready: {ready}\n{logs}")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("shots-s3")
    return {"IQ3_S": synth_shot(root / "iq3s", 21), "IQ2_XS": synth_shot(root / "iq2xs", 22, "IQ2_XS", frames=4)}


@pytest.fixture(scope="module")
def fault_free(hosts: Hosts, shots: dict[str, list[Path]]) -> Callable[[str], dict]:
    """The finished job of a fault-free render of a camera's shot, rendered once for the module: the IQ3_S one is
    both checked by its own test and the reference the kill test compares with."""
    jobs: dict[str, dict] = {}

    def render(camera: str) -> dict:
        if camera not in jobs:
            jobs[camera] = _wait(hosts, _submit(hosts, shots[camera]))
        return jobs[camera]

    return render


def _submit(h: Hosts, files: list[Path]) -> str:
    with httpx.Client(base_url=h.url, headers=h.headers, timeout=60) as c:
        r = c.post("/v1/jobs", files=[("frames", (p.name, p.read_bytes())) for p in files])
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _wait(h: Hosts, job_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=h.url, headers=h.headers, timeout=30) as c:
        while time.monotonic() < deadline:
            job = c.get(f"/v1/jobs/{job_id}").json()
            if job["status"] not in ("queued", "running"):
                return dict(job)
            time.sleep(0.2)
    pytest.fail(f"job {job_id} did not finish")


def _download(h: Hosts, job: dict) -> bytes:
    out = job["outputs"][0]
    data = httpx.get(h.url + out["url"], headers=h.headers, timeout=60).content
    assert hashlib.sha256(data).hexdigest() == out["sha256"]
    return data


def _bucket_keys(h: Hosts, job_id: str) -> list[str]:
    from services.config import Settings
    from services.storage import storage_from_settings

    storage = storage_from_settings(Settings(storage_url=h.storage_url, data_dir=h.root / "test"))
    return sorted(k.split("/", 2)[2] for k, _ in storage.list_sizes(f"jobs/{job_id}"))


@pytest.mark.parametrize("camera", ["IQ2_XS", "IQ3_S"])
def test_both_hosts_take_shards_through_the_bucket(hosts: Hosts, fault_free: Callable[[str], dict],
                                                   camera: str) -> None:
    job = fault_free(camera)
    assert job["status"] == "done", job["error"]
    gpu_shards = [s for s in job["shards"] if s["kind"] in ("strip", "frame_group")]
    assert {s["worker"].split("@")[1] for s in gpu_shards} == {"hosta", "hostb"}, gpu_shards
    _download(hosts, job)
    # uploads and the output stay; the intermediates go just after the job is marked done (the finalize commits
    # "done" first, then writes the final preview and removes them), so wait for that
    deadline = time.monotonic() + 60
    while True:
        keys = _bucket_keys(hosts, job["id"])
        left = [k for k in keys if not k.startswith(("frames/", "out/", "preview"))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == [] and "out/frame_00.tif" in keys
    assert not (hosts.root / "api" / "storage").exists()  # nothing on the API host's disk but its scratch...
    assert list((hosts.root / "api" / "scratch" / "obj").glob("*/*")) == []  # ...which the probe never filled


def test_a_host_killed_mid_shard_job_completes_identically(hosts: Hosts, shots: dict[str, list[Path]],
                                                           fault_free: Callable[[str], dict]) -> None:
    from workers.registry import live_workers, redis_client

    reference = _download(hosts, fault_free("IQ3_S"))
    job_id = _submit(hosts, shots["IQ3_S"])
    victim = None
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=hosts.url, headers=hosts.headers, timeout=30) as c:
        while victim is None and time.monotonic() < deadline:
            running = [s for s in c.get(f"/v1/jobs/{job_id}").json()["shards"]
                       if s["status"] == "running" and s["worker"]]
            victim = running[0]["worker"] if running else None
            time.sleep(0 if victim else 0.05)
    assert victim, "no shard was seen running"
    info = {w.name: w for w in live_workers(redis_client(hosts.redis_url))}[victim]
    os.kill(info.pid, signal.SIGKILL)  # the host's worker vanishes: no clean-up, no acknowledgement
    job = _wait(hosts, job_id, timeout=180)
    assert job["status"] == "done", job["error"]
    assert any(s["attempts"] >= 2 for s in job["shards"]), "the killed shard should have run again"
    assert hashlib.sha256(_download(hosts, job)).hexdigest() == hashlib.sha256(reference).hexdigest()
