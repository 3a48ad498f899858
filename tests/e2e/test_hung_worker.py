"""The only GPU worker stopped with SIGSTOP while it computes a shard (alive, its connections open, but silent: what
a process stuck in a call that never lets its heartbeat thread run looks like): its supervisor sees the worker's own
heartbeat stop, SIGKILLs it after STRATA_WORKER_HUNG_AFTER_S and restarts it; the shard it held is computed by the
new process and the job finishes, its output byte-identical to a fault-free render. Found from outside: before, the
stopped worker was never restarted, its shard was re-dispatched to a queue that only it read, and the job waited
for good. Outcomes only, within bounded waits: how fast is not asserted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.supervised import Service, supervised_service, synth_shot
from tests.e2e.supervised import submit as _submit
from tests.e2e.supervised import wait as _wait

pytestmark = pytest.mark.e2e

SHARD_DELAY_S = 1.5  # failure drill: every shard pauses before it computes, a window to stop its worker
# (its heartbeat names the shard before the pause: the worker is stopped within about 0.1 s of it starting)
HUNG_AFTER_S = 8.0  # well above a loaded 2-core host's longest gap between beats (measured: about 1 beat)


def _one_cpu_worker(specs: list) -> None:
    assert [s.name.split("@")[0] for s in specs if s.env.get("STRATA_WORKER_KIND") == "gpu"] == ["cpu0"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Service]:
    env = {"STRATA_COORDINATORS": "1", "STRATA_EXPRESS_COORDINATORS": "0", "STRATA_CPU_WORKERS": "1",
           "STRATA_FAULT_SHARD_DELAY_S": str(SHARD_DELAY_S), "STRATA_WORKER_HUNG_AFTER_S": str(HUNG_AFTER_S)}
    with supervised_service(tmp_path_factory.mktemp("hung"), redis_url, env,
                            lambda workers: workers.get("gpu", 0) >= 1, _one_cpu_worker,
                            hang_check=True) as service:
        yield service


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return synth_shot(tmp_path_factory.mktemp("shot"), 23)


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
