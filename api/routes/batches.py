"""Batches: create (server-side paths or empty), add uploaded shots, list, status, report, cancel."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from api.deps import SessionDep, StationDep
from api.routes.jobs import ERRORS, UPLOAD_BODY, IdempotencyKeyH, Shot, receive_shot
from api.schemas import BatchCreate, BatchList, BatchOut, BatchReport, ErrorOut, JobOut, ShotOut
from services import idempotency
from services.batches import report as reports
from services.batches import service
from services.config import get_settings
from services.db.models import Batch
from services.storage import get_storage

router = APIRouter(prefix="/v1/batches", tags=["batches"])
SHOT_ERRORS: dict[int | str, dict] = {**ERRORS, 403: {"model": ErrorOut}}  # another station's batch


def _outs(session: SessionDep, batches: list[Batch]) -> list[BatchOut]:
    """The batches as the API shows them, their shots counted in one query for all (not loaded one by one)."""
    tallies = service.batch_tallies(session, [b.id for b in batches])
    return [BatchOut.model_validate(reports.summary(b, tallies[b.id])) for b in batches]


def _out(session: SessionDep, batch: Batch) -> BatchOut:
    return _outs(session, [batch])[0]


@router.post("", status_code=201, response_model=BatchOut, responses=ERRORS,
             summary="Create a batch (its shots from server-side paths, or uploaded later)")
def create_batch(body: BatchCreate, response: Response, session: SessionDep, station: StationDep,
                 idempotency_key: IdempotencyKeyH = None) -> BatchOut:
    key = idempotency.check_key(idempotency_key)
    if key is None:
        return _create_batch(body, session, station)
    claim = idempotency.claim(session, station, key, "batches", idempotency.fingerprint(body.model_dump(mode="json")),
                              get_settings().idempotency_hours)
    if claim.replay is not None:
        response.headers["Idempotent-Replayed"] = "true"
        batch = service.get_batch(session, station, claim.replay)
        replay = _out(session, batch)
        replay.webhook_secret = batch.webhook_secret  # the first answer may never have reached the client
        return replay
    try:
        out = _create_batch(body, session, station)
    except BaseException:
        idempotency.release(session, claim)
        raise
    idempotency.complete(session, claim, out.id)
    return out


def _create_batch(body: BatchCreate, session: SessionDep, station: StationDep) -> BatchOut:
    request = service.BatchRequest(
        name=body.name, recipes=tuple(body.recipes), priority=body.priority, not_before=body.not_before,
        not_after=body.not_after, on_window_end=body.on_window_end, paths=tuple(body.paths),
        webhook_url=body.webhook_url, sealed=body.sealed)
    batch = service.create_batch(session, get_storage(), get_settings(), station, request)
    out = _out(session, batch)
    out.webhook_secret = batch.webhook_secret
    return out


@router.post("/{batch_id}/shots", status_code=202, response_model=JobOut, responses=SHOT_ERRORS,
             openapi_extra=UPLOAD_BODY, summary="Upload a shot into a batch (same multipart as POST /v1/jobs)")
async def add_shot(batch_id: str, request: Request, response: Response, session: SessionDep,
                   station: StationDep, idempotency_key: IdempotencyKeyH = None) -> JobOut:
    shot = Shot(session, station, f"batch:{batch_id}", idempotency_key)
    job = await receive_shot(request, response, shot, lambda job_id, files, form: service.add_shot(
        session, get_storage(), station, batch_id, job_id, files, form))
    return JobOut.of(job)


@router.get("", response_model=BatchList, responses=ERRORS,
            summary="The batches this token may see (a station: its own; an admin: all), newest first")
def list_batches(session: SessionDep, station: StationDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
                 cursor: str | None = None,
                 station_name: Annotated[str | None, Query(alias="station", description="Admins: one station's "
                                                                   "batches.")] = None) -> BatchList:
    batches, next_cursor = service.list_batches(session, station, limit=limit, cursor=cursor,
                                                station_name=station_name)
    return BatchList(batches=_outs(session, batches), next_cursor=next_cursor)


@router.get("/{batch_id}", response_model=BatchOut, responses=ERRORS, summary="Batch status, counts and ETA")
def get_batch(batch_id: str, session: SessionDep, station: StationDep) -> BatchOut:
    return _out(session, service.get_batch(session, station, batch_id))


@router.get("/{batch_id}/report", response_model=BatchReport, responses={**ERRORS, 200: {"content": {
    "application/json": {}, "text/csv": {}}}}, summary="Every shot: status, timings, outputs (JSON or CSV)")
def batch_report(batch_id: str, session: SessionDep, station: StationDep,
                 format: Annotated[Literal["json", "csv"], Query()] = "json") -> BatchReport | Response:
    batch = service.get_batch(session, station, batch_id)
    jobs = service.batch_jobs(session, batch)
    rows = reports.shot_rows(jobs)
    if format == "csv":
        return Response(reports.report_csv(rows), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="batch-{batch.id}.csv"'})
    return BatchReport(batch=_out(session, batch), shots=[ShotOut.model_validate(asdict(r)) for r in rows])


@router.post("/{batch_id}/seal", response_model=BatchOut, responses=SHOT_ERRORS,
             summary="No more shots are coming: the batch ends once its shots are over")
def seal_batch(batch_id: str, session: SessionDep, station: StationDep) -> BatchOut:
    return _out(session, service.seal_batch(session, station, batch_id))


@router.post("/{batch_id}/cancel", response_model=BatchOut, responses=ERRORS,
             summary="Cancel a batch and its queued or running shots")
def cancel_batch(batch_id: str, session: SessionDep, station: StationDep) -> BatchOut:
    return _out(session, service.cancel_batch(session, get_storage(), station, batch_id))
