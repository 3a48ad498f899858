"""Liveness and readiness."""

from __future__ import annotations

import os

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.schemas import Health, Readiness
from services.config import get_settings
from services.db.schema import schema_problem
from services.db.session import session_scope
from services.errors import StorageUnavailable
from services.jobs.storage_identity import ensure_ours
from services.storage import get_storage
from workers.app import COORDINATOR_QUEUES, GPU_QUEUES, broker_url
from workers.registry import live_workers, queue_depths, redis_client

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The API process is up")
def healthz() -> Health:
    return Health(status="ok")


def _readiness() -> tuple[bool, Readiness]:
    db = redis_state = "ok"
    workers: dict[str, int] = {"gpu": 0, "coordinator": 0}
    queues: dict[str, int] = {}
    problem = schema_problem()  # unreachable, or not at this release's revision (not migrated, or newer)
    if problem is not None:
        db = f"error: {problem}"
    try:
        client = redis_client(broker_url(get_settings()))
        client.ping()
        for w in live_workers(client):
            workers[w.kind] = workers.get(w.kind, 0) + 1
        queues = queue_depths(client, [*COORDINATOR_QUEUES, *GPU_QUEUES])
    except Exception as exc:  # noqa: BLE001
        redis_state = f"error: {type(exc).__name__}"
    storage = "ok"
    try:
        get_storage().check()
        if db == "ok":
            with session_scope() as session:
                ensure_ours(session, get_storage())  # this database's storage, not another host's idea of it
    except StorageUnavailable as exc:
        storage = f"error: {exc.detail}"
    except Exception as exc:  # noqa: BLE001
        storage = f"error: {type(exc).__name__}: {exc}"
    reasons = [f"{what}: {state.removeprefix('error: ')}" for what, state in (
        ("database", db), ("redis", redis_state), ("storage", storage)) if state != "ok"]
    if redis_state == "ok":
        reasons += [f"no {kind} worker has a live heartbeat (start `strata {command}`, or see its log)"
                    for kind, command in (("gpu", "workers"), ("coordinator", "coordinator")) if not workers[kind]]
    ok = not reasons
    return ok, Readiness(status="ready" if ok else "not_ready", database=db, redis=redis_state, storage=storage,
                         workers=workers, queues=queues, reasons=reasons)


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}},
            summary="Database, Redis, storage, a coordinator and at least one GPU worker are up")
async def readyz() -> JSONResponse:
    ok, body = await run_in_threadpool(_readiness)
    instance = os.environ.get("STRATA_SERVE_INSTANCE")  # the `strata serve` that started this API
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503,
                        headers={"X-Strata-Instance": instance} if instance else None)
