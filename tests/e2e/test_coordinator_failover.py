"""Two coordinators, one SIGKILLed while it ingests a job: the survivor takes the job over (its supervisor hands the
dead one's leases back, the survivor's reconciler re-sends the ingest, the survivor runs it) and the output is
byte-identical to a fault-free render. The dead coordinator is not restarted here, so only the survivor can have
finished the job. Outcomes only: how fast is measured by `strata chaos` (docs/OPERATIONS.md)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.supervised import Service, supervised_service, synth_shot
from tests.e2e.supervised import submit as _submit
from tests.e2e.supervised import wait as _wait

pytestmark = pytest.mark.e2e

INGEST_DELAY_S = 2.0  # failure drill: every ingest pauses after marking the job running, a window for the kill
# (the holder is seen, the job read and the coordinator killed within about 0.1 s of the ingest starting)


def _three_coordinators(specs: list) -> None:
    assert [s.name.split("@")[0] for s in specs if s.env.get("STRATA_WORKER_KIND") == "coordinator"] == [
        "coordinator", "coordinator2", "coordinator-express"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Service]:
    base, _, db_number = redis_url.rpartition("/")
    n = int(db_number or 0)
    own_redis = f"{base}/{n + 3 if n + 3 < 16 else n - 1}"  # apart from the other e2e modules' (+1, +2), in 0-15
    env = {"STRATA_COORDINATORS": "2", "STRATA_CPU_WORKERS": "1", "STRATA_FAULT_INGEST_DELAY_S": str(INGEST_DELAY_S)}
    # No restarts: a killed coordinator stays dead, so whatever finishes its job is the other one.
    with supervised_service(tmp_path_factory.mktemp("failover"), own_redis, env,
                            lambda workers: workers.get("coordinator", 0) >= 2, _three_coordinators,
                            restart=False) as service:
        yield service


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return synth_shot(tmp_path_factory.mktemp("shot"), 21)


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

    job_id = _submit(service, shot)
    victim = _holder(service, job_id)
    job = httpx.get(f"{service.url}/v1/jobs/{job_id}", headers=service.headers, timeout=30).json()
    assert (job["status"], job["stage"]) == ("running", "decoding")  # killed mid-ingest, in the drill's pause
    info = {w.name: w for w in live_workers(redis_client(service.redis_url))}[victim]
    os.kill(info.pid, signal.SIGKILL)  # no chance to clean up, release its lease or acknowledge
    # The fault-free render of the same shot, beside the takeover: sent after the kill, only the surviving
    # coordinators can take it (nothing of it was ever on the dead one).
    reference_id = _submit(service, shot)

    job = _wait(service, job_id)
    reference = _wait(service, reference_id)
    assert reference["status"] == "done", reference["error"]
    assert job["status"] == "done", job["error"]
    coordinators = [w for w in live_workers(redis_client(service.redis_url), "coordinator")]
    assert [w.name for w in coordinators] != [] and victim not in {w.name for w in coordinators}
    assert [o["sha256"] for o in job["outputs"]] == [o["sha256"] for o in reference["outputs"]]
