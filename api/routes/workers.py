"""GPU workers and queue depths (any valid token: nothing in it belongs to one station)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import SessionDep, StationDep
from api.schemas import ErrorOut, WorkerOut, WorkersOut
from services.config import get_settings
from services.db.models import Job, Shard, Station
from services.errors import BrokerUnavailable
from workers.app import COORDINATOR_QUEUES, GPU_QUEUES, PRIORITIES, broker_url
from workers.registry import WorkerInfo, live_workers, queue_depths_by_priority, redis_client

router = APIRouter(prefix="/v1", tags=["workers"])
UNAVAILABLE: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}, 503: {"model": ErrorOut}}


@contextmanager
def _broker() -> Iterator[redis.Redis]:
    try:
        yield redis_client(broker_url(get_settings()))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BrokerUnavailable(f"the broker (Redis) is unavailable ({exc}); retry shortly") from exc


@dataclass(frozen=True)
class Visible:
    """The job and shard ids a principal may see in the heartbeats (None: all of them, an admin)."""

    jobs: frozenset[str] | None = None
    shards: frozenset[int] | None = None


def visible_to(session: Session, station: Station, workers: list[WorkerInfo]) -> Visible:
    """An admin sees every id; a station only its own jobs' and their shards' (found from outside: another
    station's job ids, which answer it 404 everywhere else, showed in GET /v1/workers)."""
    if station.is_admin:
        return Visible()
    job_ids = {j for w in workers for j in w.jobs}
    shard_ids = {s for w in workers for s in w.shards}
    jobs = set(session.scalars(select(Job.id).where(Job.id.in_(job_ids), Job.station_id == station.id))) \
        if job_ids else set()
    shards = set(session.scalars(select(Shard.id).join(Job, Shard.job_id == Job.id).where(
        Shard.id.in_(shard_ids), Job.station_id == station.id))) if shard_ids else set()
    return Visible(frozenset(jobs), frozenset(shards))


def _out(w: WorkerInfo, seen: Visible) -> WorkerOut:
    beat = dt.datetime.fromtimestamp(w.beat_at, dt.UTC) if w.beat_at else None
    shards = [s for s in w.shards if seen.shards is None or s in seen.shards]
    return WorkerOut(name=w.name, kind=w.kind, host=w.host, gpu=w.gpu, device=w.device, busy=w.busy,
                     current_shard=shards[0] if shards else None, shards=shards,
                     jobs=[j for j in w.jobs if seen.jobs is None or j in seen.jobs], memory_mb=w.memory_mb,
                     last_heartbeat=beat)


def _queues(client: redis.Redis) -> dict[str, dict[str, int]]:
    workers = live_workers(client, "gpu")
    queues = [*COORDINATOR_QUEUES, *GPU_QUEUES, *(w.queue for w in workers)]
    return queue_depths_by_priority(client, queues, PRIORITIES)


@router.get("/workers", response_model=WorkersOut, responses=UNAVAILABLE,
            summary="Live workers (heartbeats) and queue depths per priority")
def list_workers(station: StationDep, session: SessionDep) -> WorkersOut:
    with _broker() as client:
        workers = live_workers(client)
        queues = _queues(client)
    seen = visible_to(session, station, workers)
    return WorkersOut(workers=[_out(w, seen) for w in workers], queues=queues)


@router.get("/queues", response_model=dict[str, dict[str, int]], responses=UNAVAILABLE,
            summary="Messages waiting per queue and priority")
def list_queues(_: StationDep) -> dict[str, dict[str, int]]:
    with _broker() as client:
        return _queues(client)
