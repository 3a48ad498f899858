"""Job use cases for the API: create from received uploads, read, list, cancel."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath

from sqlalchemy import Select, and_, func, or_, select, update
from sqlalchemy.orm import Session, selectinload

from services.db.models import Frame, Job, Output, Station, as_utc, utcnow
from services.db.session import execute_update
from services.errors import (
    BadInput,
    BadRawFile,
    ChecksumMismatch,
    Conflict,
    FramesMismatch,
    Gone,
    NotFound,
    UnsupportedSensor,
)
from services.export.naming import sanitise, validate_template
from services.export.recipes import RECIPE_DEFS, recipe_snapshot, resolve_recipes
from services.jobs import retention
from services.jobs.cameras import resolve_camera
from services.jobs.ending import end_unfinished_shards
from services.jobs.states import ACTIVE, JobStatus, Priority, Stage, in_batch_lane, parse_enum
from services.raw.probe import RawProbe, probe_raw
from services.stations import ensure_visible, owner_filter
from services.storage import Storage
from services.storage.intermediates import drop_intermediates
from services.storage.keys import job_prefix, preview_key

STATUSES = tuple(s.value for s in JobStatus)
PRIORITIES = tuple(p.value for p in Priority)


@dataclass(frozen=True)
class Upload:
    """A fully received upload, already in storage under ``storage_key`` (not yet checked)."""

    name: str
    storage_key: str
    sha256: str
    bytes: int
    original_name: str = ""  # the file name as sent (shown to people; ``name`` is its safe form)


@dataclass(frozen=True)
class ReceivedFile:
    """An upload that is a RAW file: its camera model from the file's metadata ("" if unknown); ``make`` and
    ``camera_model`` as the file states them, ``layout`` as the probe read it ("bayer", "linear", "": unknown)."""

    name: str
    storage_key: str
    sha256: str
    bytes: int
    model: str
    original_name: str = ""
    make: str = ""
    camera_model: str = ""
    layout: str = ""


@dataclass(frozen=True)
class JobRequest:
    """The form fields of an upload: all optional (camera detected, default recipe, interactive).

    ``recipes``: every recipe asked for, in order (``recipe``, a single one, is kept for callers that give one);
    ``naming``: a naming template for this job's outputs instead of each recipe's own."""

    camera: str | None = None
    recipe: str | None = None
    priority: str | None = None
    sha256: tuple[str, ...] = ()
    recipes: tuple[str, ...] = ()
    naming: str | None = None

    @classmethod
    def from_form(cls, fields: Mapping[str, Sequence[str]]) -> JobRequest:
        """Single-valued fields once at most; ``recipe`` and ``sha256`` repeated or comma-separated. A field of
        another name is refused: a misspelt one (``recipes``, ``Priority``) was ignored, and the shot rendered with
        the defaults instead of what the station asked for."""
        unknown = sorted(set(fields) - FORM_FIELDS)
        if unknown:
            raise BadInput(f"unknown form field(s) {', '.join(repr(f[:40]) for f in unknown[:5])}; expected "
                           f"{', '.join(sorted(FORM_FIELDS))} and the files under 'frames'")
        sha = tuple(v for raw in fields.get("sha256", []) for v in raw.split(",") if v.strip())
        recipes = tuple(v.strip() for raw in fields.get("recipe", []) for v in raw.split(",") if v.strip())
        return cls(camera=_one(fields, "camera"), priority=_one(fields, "priority"), sha256=sha, recipes=recipes,
                   naming=_one(fields, "naming"))

    @property
    def recipe_names(self) -> tuple[str, ...]:
        return self.recipes or ((self.recipe,) if self.recipe else ())


FORM_FIELDS = frozenset({"camera", "priority", "recipe", "sha256", "naming"})


def _one(fields: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = [v for v in fields.get(name, []) if v.strip()]
    if len(values) > 1:
        raise BadInput(f"form field {name!r} given {len(values)} times")
    return values[0] if values else None


@contextmanager
def discard_on_error(storage: Storage, job_id: str) -> Iterator[None]:
    """Everything stored under the job's prefix is deleted if the block fails (nothing half-written stays)."""
    try:
        yield
    except BaseException:
        storage.delete_prefix(job_prefix(job_id))
        raise


def probe_uploads(storage: Storage, uploads: Sequence[Upload]) -> list[ReceivedFile]:
    """Check that every upload is a RAW file (structure only, never LibRaw); ``BadRawFile`` naming the file."""
    files, probes = [], []
    for u in uploads:
        try:
            with storage.open(u.storage_key) as f:  # ranged reads of the TIFF structure on object storage
                probe = probe_raw(f)
        except (BadRawFile, UnsupportedSensor) as exc:
            raise type(exc)(f"{u.name}: {exc.reason}") from exc
        probes.append(probe)
        files.append(ReceivedFile(u.name, u.storage_key, u.sha256, u.bytes, f"{probe.make} {probe.model}".strip(),
                                  u.original_name, make=probe.make, camera_model=probe.model, layout=probe.layout))
    if len(files) > 1 and any(f.layout == "linear" for f in files):
        raise UnsupportedSensor("a stack of linear DNGs is not supported: a linear DNG renders as a single frame "
                                "(one file per job)")
    check_stack_frames([f.name for f in files], probes)
    return files


def check_stack_frames(names: Sequence[str], probes: Sequence[RawProbe]) -> None:
    """A stack's frames whose files state their size and CFA pattern (DNGs) must agree with frame 0's:
    :class:`FramesMismatch` naming both, at upload, instead of a job that fails at decode. What a probe could not
    read (0 x 0, no pattern: other RAW formats) is left to the decoder's same check."""
    for i in range(1, len(probes)):
        name, p, first = names[i], probes[i], probes[0]
        size, size0 = (p.width, p.height), (first.width, first.height)
        if 0 not in size + size0 and size != size0:
            raise FramesMismatch(f"{name}: frame {i} is {p.width} x {p.height} pixels but frame 0 ({names[0]}) is "
                                 f"{first.width} x {first.height}: a stack's frames must have one size")
        if p.cfa and first.cfa and p.cfa != first.cfa:
            raise FramesMismatch(f"{name}: frame {i} has the CFA pattern {p.cfa} but frame 0 ({names[0]}) has "
                                 f"{first.cfa}: a stack's frames must have one pattern")


def source_camera(files: Sequence[ReceivedFile]) -> dict[str, str]:
    """The job's ``source_camera`` param: frame 0's Make and Model as the file states them, and its layout."""
    first = files[0]
    return {"make": first.make, "model": first.camera_model, "layout": first.layout}


def submit_job(session: Session, storage: Storage, station: Station, job_id: str, uploads: Sequence[Upload],
               request: JobRequest, *, batch_id: str | None = None) -> Job:
    """Probe the received uploads and record the job (status ``queued``); the caller enqueues its ingest when
    :func:`enqueue_now` says so (the batch lane waits for admission)."""
    files = probe_uploads(storage, uploads)
    job = create_job(session, station, job_id, files, camera=request.camera, recipe=None,
                     recipes=request.recipe_names, naming=request.naming, priority=request.priority,
                     sha256=list(request.sha256), batch_id=batch_id)
    return get_job(session, station, job.id)


def enqueue_now(job: Job) -> bool:
    """Whether the caller sends the job's ingest now (interactive) or leaves it to admission (batch lane)."""
    return job.admitted_at is not None


MAX_SAFE_NAME = 120  # bytes (ASCII): keys and ``.part-*`` temp names stay far below the 255-byte limit


def mark_enqueued(session: Session, job_id: str) -> None:
    """The job's ingest message is with the broker (the outbox has nothing to send for it)."""
    execute_update(session, update(Job).where(Job.id == job_id, Job.enqueued_at.is_(None))
                   .values(enqueued_at=utcnow()))
    session.commit()


def safe_name(name: str, index: int) -> str:
    """A file name safe to use in storage keys and downloads: ASCII only (``A-Z a-z 0-9 . _ -``; accents
    folded, other characters dropped), the extension kept, at most :data:`MAX_SAFE_NAME` bytes; a stem with
    nothing left becomes ``frame_NN``. The name as sent is kept apart (``Frame.original_name``)."""
    base = PurePosixPath(name.replace("\\", "/")).name
    stem, dot, ext = base.rpartition(".") if "." in base.strip(".") else (base, "", "")
    clean_ext = sanitise(ext, 10) if dot and ext else ""
    clean_ext = "" if clean_ext == "output" else clean_ext
    clean_stem = sanitise(stem, MAX_SAFE_NAME - len(clean_ext) - 1, fallback=f"frame_{index:02d}")
    return f"{clean_stem}.{clean_ext}" if clean_ext else clean_stem


def create_job(
    session: Session,
    station: Station,
    job_id: str,
    files: list[ReceivedFile],
    *,
    camera: str | None,
    recipe: str | None,
    priority: str | None,
    sha256: list[str],
    recipes: Sequence[str] = (),
    naming: str | None = None,
    batch_id: str | None = None,
) -> Job:
    """Validate the request against the received files and record the job (status ``queued``).

    ``recipes`` (or the single ``recipe``; none: the default) are resolved now: an unknown one, more than
    :data:`~services.export.recipes.MAX_RECIPES_PER_JOB`, or a bad ``naming`` template is a ``BadInput``."""
    if not files:
        raise BadInput("no frames: upload one or more RAW files under the form field 'frames'")
    priority = parse_enum(Priority, priority or Priority.INTERACTIVE, "priority")
    chosen = resolve_recipes(list(recipes) or ([recipe] if recipe else []))
    if naming is not None:
        validate_template(naming.strip())
    if sha256:
        if len(sha256) != len(files):
            raise BadInput(f"got {len(sha256)} sha256 values for {len(files)} frames; give one per frame, in order")
        for i, (want, got) in enumerate(zip(sha256, files, strict=True)):
            if want.strip().lower() != got.sha256:
                raise ChecksumMismatch(f"frame {i} ({got.name}): sha256 {got.sha256} does not match {want.strip()}")
    profile = resolve_camera(camera, [f.model for f in files], len(files))
    _refuse_repeated_frames(files)
    job = Job(id=job_id, station_id=station.id, status=JobStatus.QUEUED, camera=profile.name,
              recipe=chosen[0].name, recipes=[r.name for r in chosen], priority=priority, stage=Stage.QUEUED,
              params={"source_camera": source_camera(files), RECIPE_DEFS: recipe_snapshot(chosen),
                      **({} if naming is None else {"naming": naming.strip()})}, batch_id=batch_id,
              admitted_at=None if in_batch_lane(priority, batch_id) else utcnow())
    job.frames = [Frame(index=i, name=f.name, sha256=f.sha256, bytes=f.bytes, storage_key=f.storage_key,
                        original_name=f.original_name or None) for i, f in enumerate(files)]
    session.add(job)
    session.commit()
    return job


def _refuse_repeated_frames(files: Sequence[ReceivedFile]) -> None:
    """A stack's frames are separate exposures: one file sent twice (the same bytes) would count its noise twice
    and be rendered told of less noise than it has, so it is refused (``BadInput``) naming both frames."""
    first: dict[str, int] = {}
    for i, f in enumerate(files):
        j = first.setdefault(f.sha256, i)
        if j != i:
            raise BadInput(f"frames {j} ({files[j].original_name or files[j].name}) and {i} "
                           f"({f.original_name or f.name}) are the same file (sha256 {f.sha256[:16]}…): a stack's "
                           "frames are separate exposures; send each once")


def get_job(session: Session, station: Station, job_id: str) -> Job:
    job = session.scalars(
        select(Job).where(Job.id == job_id)
        .options(selectinload(Job.frames), selectinload(Job.shards), selectinload(Job.outputs))
    ).one_or_none()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    ensure_visible(station, job.station_id, f"job {job_id}")
    return job


def _encode_cursor(job: Job) -> str:
    return encode_cursor(as_utc(job.created_at), job.id)


def encode_cursor(created: dt.datetime, row_id: str) -> str:
    """A keyset cursor (creation time, id) for listings newest first."""
    return base64.urlsafe_b64encode(json.dumps([created.isoformat(), row_id]).encode()).decode()


MAX_CURSOR = 256  # characters: a real cursor is about 100


def decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    """The (creation time, id) of a cursor from :func:`encode_cursor`; ``BadInput`` for anything else (too
    long, not base64, not JSON, nested, wrong shapes)."""
    if len(cursor) > MAX_CURSOR:
        raise BadInput(f"invalid cursor: longer than {MAX_CURSOR} characters")
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            raise ValueError("not a [time, id] pair")
        created = dt.datetime.fromisoformat(value[0])
        return (created if created.tzinfo else created.replace(tzinfo=dt.UTC)), value[1]
    except (ValueError, TypeError, RecursionError, UnicodeError) as exc:
        raise BadInput("invalid cursor") from exc


@dataclass(frozen=True)
class JobFilter:
    """What a list is limited to: a status or several (comma-separated), a station (admins only; a station always
    sees its own), a file name search (case-insensitive substring of any frame's name)."""

    status: str | None = None
    station: str | None = None
    search: str | None = None


def _filtered(session: Session, principal: Station, where: JobFilter) -> Select[Job]:
    wanted = [s.strip() for s in (where.status or "").split(",") if s.strip()]  # "done,failed": either
    for status in wanted:
        if status not in STATUSES:
            raise BadInput(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
    stmt = select(Job).options(selectinload(Job.frames), selectinload(Job.shards), selectinload(Job.outputs))
    owner = owner_filter(principal, where.station, session)
    if owner is not None:
        stmt = stmt.where(Job.station_id == owner)
    if wanted:
        stmt = stmt.where(Job.status.in_(wanted))
    if where.search and where.search.strip():
        escaped = where.search.strip().lower().replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_")
        pattern = "%" + escaped + "%"  # a backslash (a Windows path's) matches itself
        stmt = stmt.where(Job.frames.any(or_(func.lower(Frame.name).like(pattern, escape="\\"),
                                             func.lower(Frame.original_name).like(pattern, escape="\\"))))
    return stmt


def list_jobs(
    session: Session, station: Station, *, status: str | None, limit: int, cursor: str | None,
    where: JobFilter | None = None,
) -> tuple[list[Job], str | None]:
    """The jobs the principal may see, newest first, keyset-paged; returns (jobs, next cursor or None)."""
    where = where or JobFilter(status=status)
    stmt = _filtered(session, station, where).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    if cursor:
        created, job_id = decode_cursor(cursor)
        stmt = stmt.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
    jobs = list(session.scalars(stmt))
    next_cursor = _encode_cursor(jobs[limit - 1]) if len(jobs) > limit else None
    return jobs[:limit], next_cursor


# The change feed's cursor lags the newest change by this much: a transaction that committed late with an
# earlier stamp is still seen (the client merges by id, so a job seen twice costs nothing).
CHANGE_OVERLAP = dt.timedelta(seconds=2)


def job_changes(session: Session, principal: Station, since: str | None, where: JobFilter, limit: int = 200
                ) -> tuple[list[Job], str]:
    """Jobs changed since the cursor (all matching ones, newest first, when there is none) and the next cursor:
    what a dashboard polls instead of reloading its whole list.

    Since a cursor the changes come oldest change first; an answer cut at ``limit`` returns a continuation cursor
    (``TIME|ID``: after that change, no overlap) so the next poll goes on where it stopped. Found from outside: the
    answer was cut newest-created first and the cursor was always "now", so past ``limit`` changes (a night batch
    cancelled) the rest were never delivered."""
    now = utcnow()
    stmt = _filtered(session, principal, where)
    if not since:
        return list(session.scalars(stmt.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit))), now.isoformat()
    stamp, after_id = _change_cursor(since)
    if after_id is None:
        with contextlib.suppress(OverflowError):  # a cursor at the start of year 1: every job has changed since
            stmt = stmt.where(Job.updated_at >= stamp - CHANGE_OVERLAP)
    else:
        stmt = stmt.where(or_(Job.updated_at > stamp, and_(Job.updated_at == stamp, Job.id > after_id)))
    jobs = list(session.scalars(stmt.order_by(Job.updated_at, Job.id).limit(limit)))
    if len(jobs) < limit:
        return jobs, now.isoformat()
    last = jobs[-1]
    return jobs, f"{as_utc(last.updated_at or now).isoformat()}|{last.id}"


def _change_cursor(since: str) -> tuple[dt.datetime, str | None]:
    """A change cursor's time (UTC) and, for a continuation, the id of the last change delivered."""
    text, _, after_id = since.partition("|")
    try:
        stamp = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadInput(f"invalid since cursor {since[:100]!r}") from exc
    stamp = stamp.replace(tzinfo=dt.UTC) if stamp.tzinfo is None else stamp.astimezone(dt.UTC)
    return as_utc(stamp), (after_id or None)


def cancel_job(session: Session, storage: Storage, station: Station, job_id: str) -> Job:
    """Cancel a queued or running job and drop its intermediates; shards not yet started are skipped by the
    workers, one already computing finishes and its result is ignored."""
    job = get_job(session, station, job_id)
    done = execute_update(
        session,
        update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE))
        .values(status=JobStatus.CANCELLED, stage=Stage.CANCELLED, finished_at=utcnow())
    )
    if done:
        end_unfinished_shards(session, job_id)
    session.commit()
    if not done:
        raise Conflict(f"job {job_id} is already {job.status}")
    session.refresh(job)
    drop_intermediates(storage, job.id)
    return job


def delete_files(session: Session, storage: Storage, station: Station, job_id: str) -> Job:
    """Remove an ended job's uploads and outputs now, instead of after ``STRATA_RETENTION_DAYS`` (a studio that
    has copied the TIFFs off; a night's batch larger than the disk). The job's record stays, its outputs answer
    410 Gone. A job still queued or running is refused (cancel it first); asking twice changes nothing."""
    job = get_job(session, station, job_id)
    if job.status in ACTIVE:
        raise Conflict(f"job {job_id} is {job.status}: cancel it before removing its files")
    if job.pruned_at is None:
        retention.discard(session, storage, job)
    return job


def output_of(job: Job, name: str) -> Output:
    for out in job.outputs:
        if out.name == name:
            if out.deleted_at is not None:
                raise Gone(f"output {name!r} of job {job.id} was removed (retention or a DELETE of its files) on "
                           f"{as_utc(out.deleted_at).isoformat(timespec='seconds')}")
            return out
    raise NotFound(f"job {job.id} has no output {name!r}")


def download_name(job: Job, out: Output) -> str:
    """The name a download is offered under: the output's (ASCII) name with the first frame's safe stem given
    back its original spelling (``写真.dng`` -> ``写真.tif`` instead of ``frame_00.tif``); separators and control
    characters never come back."""
    frame = job.frames[0] if job.frames else None
    if frame is None or not frame.original_name:
        return out.name
    safe_stem = PurePosixPath(frame.name).stem
    original = PurePosixPath(frame.original_name.replace("\\", "/")).name
    original_stem = original.rpartition(".")[0] if "." in original.strip(".") else original
    original_stem = "".join(c for c in original_stem if c.isprintable() and c not in '/\\"').strip()
    if not original_stem or not out.name.startswith(safe_stem):
        return out.name
    return original_stem + out.name[len(safe_stem):]


@dataclass(frozen=True)
class Preview:
    key: str
    etag: str
    kind: str


def preview_of(session: Session, storage: Storage, principal: Station, job_id: str) -> Preview:
    """The job's preview, NotFound while it has none (not decoded yet, or failed before a preview)."""
    job = get_job(session, principal, job_id)
    key = preview_key(job.id)
    if job.pruned_at is not None:
        raise Gone(f"job {job_id}'s files were removed on {as_utc(job.pruned_at).isoformat(timespec='seconds')}")
    if not job.preview_etag or not storage.exists(key):
        raise NotFound(f"job {job_id} has no preview yet" + (f" ({job.status})" if job.status != "queued" else ""))
    return Preview(key, job.preview_etag, job.preview_kind or "fast")
