"""GPU workers and queue depths (any valid token: nothing in it belongs to one station)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from fastapi import APIRouter

from api.deps import StationDep
from api.schemas import ErrorOut, WorkerOut, WorkersOut
from services.config import get_settings
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


def _out(w: WorkerInfo) -> WorkerOut:
    beat = dt.datetime.fromtimestamp(w.beat_at, dt.UTC) if w.beat_at else None
    return WorkerOut(name=w.name, kind=w.kind, host=w.host, gpu=w.gpu, device=w.device, busy=w.busy,
                     current_shard=w.current_shard, shards=list(w.shards), jobs=list(w.jobs), memory_mb=w.memory_mb,
                     last_heartbeat=beat)


def _queues(client: redis.Redis) -> dict[str, dict[str, int]]:
    workers = live_workers(client, "gpu")
    queues = [*COORDINATOR_QUEUES, *GPU_QUEUES, *(w.queue for w in workers)]
    return queue_depths_by_priority(client, queues, PRIORITIES)


@router.get("/workers", response_model=WorkersOut, responses=UNAVAILABLE,
            summary="Live workers (heartbeats) and queue depths per priority")
def list_workers(_: StationDep) -> WorkersOut:
    with _broker() as client:
        return WorkersOut(workers=[_out(w) for w in live_workers(client)], queues=_queues(client))


@router.get("/queues", response_model=dict[str, dict[str, int]], responses=UNAVAILABLE,
            summary="Messages waiting per queue and priority")
def list_queues(_: StationDep) -> dict[str, dict[str, int]]:
    with _broker() as client:
        return _queues(client)
