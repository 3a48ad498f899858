"""Retention, in one place: what storage holds for each job, and when it goes.

- Intermediates (decoded frames, shard results) go when a job ends: every end (done, failed, cancelled, started
  over) calls :func:`services.storage.intermediates.remove_intermediates`; :func:`sweep_intermediates` removes
  those an ended job left behind (a crash between the status update and the deletion).
- Uploads and outputs are kept ``STRATA_RETENTION_DAYS`` after the job finished (0 = forever), then
  :func:`prune` removes the job's whole storage prefix and marks it in the database (``jobs.pruned_at``,
  ``outputs.deleted_at``: a download then answers 410 Gone). Never while :func:`still_referenced` holds.

The coordinator runs :func:`retention_pass` every ``STRATA_RETENTION_INTERVAL_S`` (one coordinator at a time);
``strata storage prune`` and ``strata storage usage`` call the same functions.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, selectinload

from services.db.models import Batch, Job, utcnow
from services.jobs.states import ACTIVE, BATCH_UNFINISHED
from services.storage.base import Storage
from services.storage.intermediates import remove_intermediates
from services.storage.keys import INTERMEDIATE_FOLDERS, job_prefix

log = logging.getLogger(__name__)

KINDS = ("uploads", "intermediates", "outputs", "other", "scratch")
_FOLDER_KIND = {"frames": "uploads", "out": "outputs", **{f: "intermediates" for f in INTERMEDIATE_FOLDERS}}


def still_referenced(job: Job, open_batches: set[str]) -> bool:
    """Whether anything may still read the job's stored files: the one rule retention obeys. An active job, or
    a shot of a batch that is still open (its report links every output until the batch ends)."""
    return job.status in ACTIVE or (job.batch_id is not None and job.batch_id in open_batches)


STALE_UPLOAD_S = 24 * 3600.0  # an upload not completed after a day was cut off (its abort failed with the link)
STALE_PARTIAL_S = 3600.0  # a local .part file untouched for an hour: its writer is gone (writers write steadily)
# Uploads with no job row (an API killed between storing a shot and recording its job) are removed once untouched for
# STALE_PARTIAL_S; more than this many at once is left alone and logged: the database is not the storage's.
ORPHAN_SWEEP_LIMIT = 20


@dataclass
class PruneReport:
    jobs: list[str] = field(default_factory=list)
    bytes: int = 0
    kept_referenced: list[str] = field(default_factory=list)
    intermediates_swept: list[str] = field(default_factory=list)
    uploads_aborted: int = 0  # object-store uploads left incomplete more than STALE_UPLOAD_S ago
    partials_swept: int = 0  # local half-written files untouched for STALE_PARTIAL_S
    orphans_swept: list[str] = field(default_factory=list)  # uploads no job row knows (sweep_orphan_uploads)


def _kind(key: str) -> tuple[str, str]:
    """(job id, kind) of a storage key ("" job id outside jobs/)."""
    parts = key.split("/")
    if len(parts) >= 3 and parts[0] == "jobs":
        return parts[1], _FOLDER_KIND.get(parts[2], "other")
    return "", "other"


def usage(storage: Storage) -> dict[str, int]:
    """Bytes stored by kind (uploads, intermediates, outputs, other) from the storage listing, and this host's
    scratch cache."""
    totals = dict.fromkeys(KINDS, 0)
    for key, size in storage.list_sizes():
        totals[_kind(key)[1]] += size
    totals["scratch"] = storage.scratch_bytes()
    return totals


Listing = Sequence[tuple[str, int]]  # (key, bytes) under "jobs": one storage listing shared by a retention pass


def sweep_intermediates(session: Session, storage: Storage, listing: Listing | None = None) -> list[str]:
    """Remove intermediates left behind by jobs that ended (or no longer exist); returns their ids. ``listing``:
    the storage's listing of "jobs", where the caller has one."""
    keys = storage.list_sizes("jobs") if listing is None else listing
    holders = {job for job, kind in (_kind(k) for k, _ in keys) if kind == "intermediates"}
    if not holders:
        return []
    active = set(session.scalars(select(Job.id).where(Job.id.in_(holders), Job.status.in_(ACTIVE))))
    swept = sorted(holders - active)
    for job_id in swept:
        remove_intermediates(storage, job_id)
    return swept


def sweep_orphan_uploads(session: Session, storage: Storage, older_than_s: float, listing: Listing | None = None
                         ) -> list[str]:
    """Remove job folders that hold only uploads, have no job row and were last written more than
    ``older_than_s`` ago: an API killed after storing a shot and before recording its job (the client retried
    and got a new job). Any other file (an output, a preview) keeps a folder; so does a listing of more than
    :data:`ORPHAN_SWEEP_LIMIT` such folders at once, which means this database is not the one the storage was
    written with (a wrong STRATA_DATABASE_URL): logged, nothing removed."""
    kinds: dict[str, set[str]] = defaultdict(set)
    for key, _ in storage.list_sizes("jobs") if listing is None else listing:
        job_id, kind = _kind(key)
        if job_id:
            kinds[job_id].add(kind)
    uploads_only = {job_id for job_id, found in kinds.items() if found == {"uploads"}}
    if not uploads_only:
        return []
    known = set(session.scalars(select(Job.id).where(Job.id.in_(uploads_only))))
    cutoff = time.time() - older_than_s
    swept = [job_id for job_id in sorted(uploads_only - known)
             if (storage.last_modified(job_prefix(job_id)) or 0.0) <= cutoff]
    if len(swept) > ORPHAN_SWEEP_LIMIT:
        log.warning("retention: %d job folders in storage have no job in the database; none removed (is "
                    "STRATA_DATABASE_URL the database this storage was written with?)", len(swept))
        return []
    for job_id in swept:
        storage.delete_prefix(job_prefix(job_id))
    return swept


def sweep_recently_ended(session: Session, storage: Storage, within_s: float, partials_older_than_s: float = 0.0
                         ) -> list[str]:
    """Remove what jobs that ended in the last ``within_s`` seconds may have left: intermediates (a coordinator
    killed between marking the job done and removing them) and half-written files anywhere in the job (its
    outputs' included) older than ``partials_older_than_s``: the final preview is written after the job is marked
    done, and sweeping its live file made that write fail (seen on a busy host). Cheap enough for the reconciler's
    pass; :func:`sweep_intermediates` catches the rest."""
    since = utcnow() - dt.timedelta(seconds=within_s)
    ended = list(session.scalars(select(Job.id).where(Job.status.not_in(ACTIVE), Job.finished_at >= since)))
    for job_id in ended:
        remove_intermediates(storage, job_id)
        storage.sweep_partials(job_prefix(job_id), partials_older_than_s)
    return ended


def _due(session: Session, before: dt.datetime) -> list[Job]:
    query = (select(Job).where(Job.finished_at.is_not(None), Job.finished_at < before, Job.pruned_at.is_(None))
             .options(selectinload(Job.outputs)).order_by(Job.finished_at))
    return list(session.scalars(query))


def prune(session: Session, storage: Storage, *, older_than_days: float, dry_run: bool = False,
          now: dt.datetime | None = None, listing: Listing | None = None) -> PruneReport:
    """Remove uploads and outputs of jobs that finished more than ``older_than_days`` ago (and still hold them),
    unless still referenced; ``dry_run`` only reports what would go. ``listing``: the storage's listing of "jobs"
    (the bytes reported), where the caller has one."""
    now = now or utcnow()
    report = PruneReport()
    sizes: dict[str, int] = defaultdict(int)
    for key, size in storage.list_sizes("jobs") if listing is None else listing:
        sizes[_kind(key)[0]] += size
    open_batches = set(session.scalars(select(Batch.id).where(Batch.status.in_(BATCH_UNFINISHED))))
    for job in _due(session, now - dt.timedelta(days=older_than_days)):
        if still_referenced(job, open_batches):
            report.kept_referenced.append(job.id)
            continue
        report.jobs.append(job.id)
        report.bytes += sizes.get(job.id, 0)
        if not dry_run:
            discard(session, storage, job, now)
    return report


def discard(session: Session, storage: Storage, job: Job, now: dt.datetime | None = None) -> None:
    """Remove an ended job's stored files (uploads, outputs, anything left) and mark it: ``jobs.pruned_at``,
    ``outputs.deleted_at``. The caller checked that nothing still reads them (retention's rule, or a studio's
    explicit ``DELETE /v1/jobs/{id}/files``)."""
    now = now or utcnow()
    job.pruned_at = now
    for out in job.outputs:
        out.deleted_at = now
    try:
        session.commit()  # marked first: a download answers 410 rather than a storage error
    except OperationalError as exc:
        if "full" not in str(exc).lower():
            raise
        _discard_on_a_full_disk(session, storage, job, now)
        return
    try:
        storage.delete_prefix(job_prefix(job.id))
    except Exception:
        # Not removed (the object store away): unmarked, so the files stay reachable and a later removal, the
        # studio's or retention's, tries again; marked, they would be orphaned for good. (Some may be gone.)
        job.pruned_at = None
        for out in job.outputs:
            out.deleted_at = None
        session.commit()
        raise


def _discard_on_a_full_disk(session: Session, storage: Storage, job: Job, now: dt.datetime) -> None:
    """The database shares a full disk and cannot commit the marks (SQLite: "database or disk is full"): the files
    go first, which gives it the room, then the marks. Found from outside: removing a done job's files, the way
    the docs give to free space, answered 503 for as long as the disk was full. (A crash between the two leaves
    the files gone and the job unmarked; its downloads then fail, and removing its files again marks it.)"""
    session.rollback()
    storage.delete_prefix(job_prefix(job.id))
    job.pruned_at = now
    for out in job.outputs:
        out.deleted_at = now
    session.commit()


def drop_if_removed(session: Session, storage: Storage, job_id: str) -> bool:
    """Delete the job's storage prefix again if its files were removed while its last step still wrote (the final
    preview is written after the job is marked done, so a client that removes the files at once could race it);
    True when it did."""
    if session.scalar(select(Job.pruned_at).where(Job.id == job_id)) is None:
        return False
    storage.delete_prefix(job_prefix(job_id))
    return True


def retention_pass(session: Session, storage: Storage, retention_days: float) -> PruneReport:
    """The periodic pass: sweep left-behind intermediates, then prune expired jobs (none when days is 0). One
    listing of the storage serves the sweeps and the prune (an object store lists 1000 keys a request: a year of
    shots is hundreds of requests, three listings a pass before); what a step removed is gone from storage but not
    from the listing, which the later steps tolerate (the prune's bytes may count swept intermediates)."""
    listing = list(storage.list_sizes("jobs"))
    swept = sweep_intermediates(session, storage, listing)
    report = (prune(session, storage, older_than_days=retention_days, listing=listing) if retention_days > 0
              else PruneReport())
    report.intermediates_swept = swept
    report.uploads_aborted = storage.abort_stale_uploads(STALE_UPLOAD_S)
    # half-written files no job will finish: an upload whose API died mid-stream has no job row to sweep it by
    report.partials_swept = storage.sweep_partials("jobs", STALE_PARTIAL_S)
    report.orphans_swept = sweep_orphan_uploads(session, storage, STALE_PARTIAL_S, listing)
    return report

