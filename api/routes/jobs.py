"""Jobs: upload, status, list, cancel, download outputs, remove files."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import SessionDep, StationDep
from api.schemas import ErrorOut, JobChanges, JobList, JobOut
from api.uploads import ReceivedForm, receive_multipart
from services import idempotency
from services.config import get_settings
from services.db.models import Job, Station, new_id
from services.errors import Gone, NotFound, RangeNotSatisfiable, UploadTooLarge
from services.jobs import service
from services.jobs.storage_identity import ensure_ours
from services.metrics import BYTES_UPLOADED
from services.storage import get_storage
from services.storage.keys import job_prefix
from workers.tasks import send_ingest

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict] = {
    code: {"model": ErrorOut} for code in (400, 401, 404, 409, 410, 413, 416, 422, 429, 503)
}

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["frames"],
                    "properties": {
                        "frames": {"type": "array", "items": {"type": "string", "format": "binary"},
                                   "description": "RAW files: 1 for IQ3_S, 2-16 for a multi-shot stack."},
                        "camera": {"type": "string", "enum": ["IQ3_S", "IQ2_XS"],
                                   "description": "Omit to detect from make/model and frame count."},
                        "recipe": {"type": "array", "items": {"type": "string"}, "default": ["tiff16"],
                                   "description": "Output recipes (GET /v1/recipes); repeat the field (or "
                                                  "separate with commas) for several outputs from one render, "
                                                  "at most 8."},
                        "naming": {"type": "string",
                                   "description": "Naming template for this job's outputs instead of each "
                                                  "recipe's (tokens: docs/RECIPES.md)."},
                        "priority": {"type": "string", "enum": ["interactive", "batch"],
                                     "default": "interactive"},
                        "sha256": {"type": "array", "items": {"type": "string"},
                                   "description": "Optional, one per frame in order; a mismatch is refused."},
                    },
                }
            }
        },
    }
}


IdempotencyKeyH = Annotated[str | None, Header(
    alias="Idempotency-Key", max_length=255,
    description="Optional: a retried request with the same key returns the same job (kept 24 h).")]


@router.post("", status_code=202, response_model=JobOut, responses=ERRORS, openapi_extra=UPLOAD_BODY,
             summary="Upload a shot (multipart) and queue it")
async def create_job(request: Request, response: Response, session: SessionDep, station: StationDep,
                     idempotency_key: IdempotencyKeyH = None) -> JobOut:
    shot = Shot(session, station, "jobs", idempotency_key)
    job = await receive_shot(request, response, shot, lambda job_id, files, form: service.submit_job(
        session, get_storage(), station, job_id, files, form))
    return JobOut.of(job)


Submit = Callable[[str, list[service.Upload], service.JobRequest], Job]


@dataclass(frozen=True)
class Shot:
    """Who uploads a shot, into which operation (``scope``), with which Idempotency-Key (None: none)."""

    session: Session
    station: Station
    scope: str
    key: str | None


def _fingerprint(form: ReceivedForm) -> str:
    return idempotency.fingerprint({"fields": form.fields,
                                    "files": [(f.original_name, f.sha256, f.bytes) for f in form.files]})


async def receive_shot(request: Request, response: Response, shot: Shot, submit: Submit) -> Job:
    """Stream a shot's multipart upload into storage, record it with ``submit`` (job id, files, form) and send
    its ingest unless it waits for admission; nothing stays in storage if any of it fails. With an
    Idempotency-Key, a retry of the same upload returns the first job (``Idempotent-Replayed: true``)."""
    settings = get_settings()
    storage = get_storage()
    key = idempotency.check_key(shot.key)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > settings.max_upload_bytes * settings.max_frames + (1 << 20):
        raise UploadTooLarge(f"request of {int(length)} bytes exceeds the upload limit")
    job_id = new_id()
    # The token lookup's transaction ends before the body streams (an upload can take minutes): its connection
    # goes back to the pool, so concurrent uploads do not exhaust it (40 at once got 500s, "QueuePool limit").
    await run_in_threadpool(ensure_ours, shot.session, storage)  # 503 where it is not this database's storage
    await run_in_threadpool(shot.session.commit)
    with service.discard_on_error(storage, job_id):
        form = await receive_multipart(request.headers.get("content-type", ""), request.stream(), storage, job_id,
                                       max_bytes=settings.max_upload_bytes, max_files=settings.max_frames,
                                       max_fields=settings.max_form_fields)
        job = await run_in_threadpool(_record, shot, key, job_id, form, submit)
    if job.id != job_id:  # a replay: the upload just received is not kept
        storage.delete_prefix(job_prefix(job_id))
        response.headers["Idempotent-Replayed"] = "true"
        return job
    BYTES_UPLOADED.inc(sum(f.bytes for f in job.frames))
    if service.enqueue_now(job):
        await run_in_threadpool(_send, shot.session, job)
    return job


def _send(session: Session, job: Job) -> None:
    """Send the recorded job's ingest on the request's own session. The job exists from here on: a failure to
    send or to record the send leaves it in the outbox, which sends it later, and the upload still gets its 202
    (a 500 made stations upload the shot again, and render it twice)."""
    try:
        send_ingest(job.id, job.priority, session)  # broker down: the outbox sends it later
    except SQLAlchemyError:
        session.rollback()
        log.exception("job %s: its ingest was not recorded as sent; the outbox sends it again", job.id)


def _record(shot: Shot, key: str | None, job_id: str, form: ReceivedForm, submit: Submit) -> Job:
    """Submit the job, or return the one an earlier request with the same Idempotency-Key created; the
    session's connection goes back to the pool before the request awaits anything else."""
    try:
        job = _submit_or_replay(shot, key, job_id, form, submit)
    except BaseException:
        shot.session.rollback()
        raise
    shot.session.commit()
    return job


def _submit_or_replay(shot: Shot, key: str | None, job_id: str, form: ReceivedForm, submit: Submit) -> Job:
    if key is None:
        return submit(job_id, form.files, service.JobRequest.from_form(form.fields))
    claim = idempotency.claim(shot.session, shot.station, key, shot.scope, _fingerprint(form),
                              get_settings().idempotency_hours)
    if claim.replay is not None:
        return service.get_job(shot.session, shot.station, claim.replay)
    try:
        job = submit(job_id, form.files, service.JobRequest.from_form(form.fields))
    except BaseException:
        idempotency.release(shot.session, claim)
        raise
    idempotency.complete(shot.session, claim, job.id)
    return job


StatusQ = Annotated[list[str] | None, Query(
    description="queued|running|done|failed|cancelled; several: repeated (status=done&status=failed) or "
                "comma-separated")]
StationQ = Annotated[str | None, Query(description="Admins: only this station's jobs (stations: ignored).")]
SearchQ = Annotated[str | None, Query(max_length=200, description="Case-insensitive part of a frame's file name.")]


@router.get("", response_model=JobList, responses=ERRORS,
            summary="List the jobs this token may see (a station: its own; an admin: all), newest first")
def list_jobs(
    session: SessionDep,
    station: StationDep,
    status: StatusQ = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
    station_name: Annotated[str | None, Query(alias="station", description="Admins: one station's jobs.")] = None,
    q: SearchQ = None,
) -> JobList:
    statuses = ",".join(status) if status else None
    jobs, next_cursor = service.list_jobs(session, station, status=statuses, limit=limit, cursor=cursor,
                                          where=service.JobFilter(statuses, station_name, q))
    return JobList(jobs=[JobOut.of(j) for j in jobs], next_cursor=next_cursor)


@router.get("/changes", response_model=JobChanges, responses=ERRORS,
            summary="Jobs changed since a cursor: what a dashboard polls instead of reloading the list")
def job_changes(
    session: SessionDep, station: StationDep, since: str | None = None, status: StatusQ = None,
    station_name: Annotated[str | None, Query(alias="station", description="Admins: one station's jobs.")] = None,
    q: SearchQ = None, limit: Annotated[int, Query(ge=1, le=500)] = 200,
) -> JobChanges:
    where = service.JobFilter(",".join(status) if status else None, station_name, q)
    jobs, cursor = service.job_changes(session, station, since, where, limit)
    return JobChanges(jobs=[JobOut.of(j) for j in jobs], cursor=cursor)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS, summary="Job status (HEAD: its headers)")
@router.head("/{job_id}", responses=ERRORS, summary="Job status headers (no body)")
def get_job(job_id: str, session: SessionDep, station: StationDep) -> JobOut:
    return JobOut.of(service.get_job(session, station, job_id))


PREVIEW_MAX_AGE_S = 5  # short: a fast preview is replaced by the render's when the job is done


PREVIEW_RESPONSES: dict[int | str, dict] = {**ERRORS, 200: {"content": {"image/jpeg": {}}},
                                             304: {"description": "Not modified"}}


@router.get("/{job_id}/preview", response_class=Response, responses=PREVIEW_RESPONSES,
            summary="The job's JPEG preview (ETag; If-None-Match answers 304; HEAD: its headers)")
@router.head("/{job_id}/preview", response_class=Response, responses=PREVIEW_RESPONSES,  # the GET's media type
             summary="The preview's headers (no body)")
def get_preview(job_id: str, session: SessionDep, station: StationDep,
                if_none_match: Annotated[str | None, Header()] = None) -> Response:
    preview = service.preview_of(session, get_storage(), station, job_id)
    headers = {"ETag": f'"{preview.etag}"', "Cache-Control": f"private, max-age={PREVIEW_MAX_AGE_S}"}
    tags = {t.strip().strip('"').removeprefix('W/"') for t in (if_none_match or "").split(",")}
    if if_none_match and (preview.etag in tags or "*" in tags):  # "*": any current representation (RFC 9110)
        return Response(status_code=304, headers=headers)
    return Response(get_storage().open(preview.key).read(), media_type="image/jpeg", headers=headers)


@router.post("/{job_id}/cancel", response_model=JobOut, responses=ERRORS, summary="Cancel a job")
def cancel_job(job_id: str, session: SessionDep, station: StationDep) -> JobOut:
    return JobOut.of(service.cancel_job(session, get_storage(), station, job_id))


@router.delete("/{job_id}/files", response_model=JobOut, responses=ERRORS,
               summary="Remove an ended job's uploads and outputs now (its record stays; downloads answer 410)")
def delete_job_files(job_id: str, session: SessionDep, station: StationDep) -> JobOut:
    return JobOut.of(service.delete_files(session, get_storage(), station, job_id))


def content_disposition(name: str, fallback: str) -> str:
    """RFC 6266 ``attachment`` with an ASCII ``filename`` (``fallback``, already safe) and, when ``name`` is
    not plain ASCII, RFC 5987 ``filename*=UTF-8''<percent-encoded>`` that browsers prefer."""
    value = f'attachment; filename="{fallback}"'
    if name != fallback:
        value += f"; filename*=UTF-8''{quote(name, safe='')}"
    return value


_RANGE = re.compile(r"^bytes=(\d{0,18})-(\d{0,18})$")  # 18 digits: past any file (more: not an int Python parses)


def _parse_range(header: str, size: int) -> tuple[int, int]:
    """A single ``bytes=a-b`` range as [start, end)."""
    m = _RANGE.match(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        raise RangeNotSatisfiable(f"unsupported Range {header!r}; use one bytes=start-end range", size)
    if m.group(1):
        start = int(m.group(1))
        end = min(int(m.group(2)) + 1, size) if m.group(2) else size
    else:
        start, end = max(size - int(m.group(2)), 0), size
    if start >= size or start >= end:
        raise RangeNotSatisfiable(f"range {header!r} is outside the {size}-byte output", size)
    return start, end


_OUTPUT_200: dict = {"content": {"image/tiff": {}, "image/jpeg": {}, "image/png": {}}}
_OUTPUT_307: dict = {"description": "STRATA_S3_DOWNLOADS=redirect: to a pre-signed URL (Location)."}


@router.get("/{job_id}/outputs/{name}",
            responses={**ERRORS, 200: _OUTPUT_200,
                       206: {"description": "The bytes of a `Range` request (Content-Range)."}, 307: _OUTPUT_307},
            response_class=Response, summary="Download an output (Range supported; HEAD answers the headers)")
@router.head("/{job_id}/outputs/{name}", responses={**ERRORS, 200: _OUTPUT_200, 307: _OUTPUT_307},
             response_class=Response, summary="An output's headers (no body)")
def download_output(
    job_id: str, name: str, request: Request, session: SessionDep, station: StationDep,
    range_header: Annotated[str | None, Header(alias="range")] = None,
) -> Response:
    job = service.get_job(session, station, job_id)
    out = service.output_of(job, name)
    storage = get_storage()
    if get_settings().s3_downloads == "redirect":  # STRATA_S3_DOWNLOADS: the client fetches from the bucket
        url = storage.presigned_url(out.storage_key, get_settings().s3_presign_s, content_type=out.media_type,
                                    disposition=content_disposition(service.download_name(job, out), out.name))
        if url is not None:
            return RedirectResponse(url, status_code=307, headers={"ETag": f'"{out.sha256}"'})
    try:
        size = storage.size(out.storage_key)
    except FileNotFoundError as exc:  # removed since the job was read (a DELETE of its files, retention)
        session.refresh(job)
        if job.pruned_at is None:  # not removed by Strata: lost from the storage under it
            raise NotFound(f"output {name!r} of job {job.id} is missing from storage (not removed by Strata: "
                           f"check the bucket or disk)") from exc
        raise Gone(f"output {name!r} of job {job.id} was removed") from exc
    headers = {"Accept-Ranges": "bytes", "ETag": f'"{out.sha256}"',
               "Content-Disposition": content_disposition(service.download_name(job, out), out.name)}
    if request.method == "HEAD":
        headers["Content-Length"] = str(size)
        return Response(status_code=200, media_type=out.media_type, headers=headers)
    if range_header:
        start, end = _parse_range(range_header, size)
        headers.update({"Content-Range": f"bytes {start}-{end - 1}/{size}", "Content-Length": str(end - start)})
        return StreamingResponse(_opened(storage.iter_chunks(out.storage_key, start, end), job.id, name),
                                 status_code=206, media_type=out.media_type, headers=headers)
    headers["Content-Length"] = str(size)
    return StreamingResponse(_opened(storage.iter_chunks(out.storage_key), job.id, name), media_type=out.media_type,
                             headers=headers)


def _opened(chunks: Iterator[bytes], job_id: str, name: str) -> Iterator[bytes]:
    """``chunks`` started before the response is: the file (or the object's stream) is open, so an output removed
    while it is sent still arrives whole (a local file's data stay until it is closed), and one removed just before
    is a 410, not a response cut off after its headers."""
    try:
        first = next(chunks, None)
    except FileNotFoundError as exc:
        raise Gone(f"output {name!r} of job {job_id} was removed") from exc
    return chain([first], chunks) if first is not None else iter(())
