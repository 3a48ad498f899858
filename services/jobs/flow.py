"""The job state machine: ingest -> GPU phases (frame groups, strips) -> finalize.

Every step is idempotent and decided from database rows, never from a queue counter: a task that runs twice
writes the same arrays (atomically) and counts once. Steps return what the caller must enqueue after the
commit, so this module knows nothing about Celery. What a step computes lives elsewhere: shot preparation and
shards in ``services.pipeline``, output files in ``services.export``; here is only who may move the job, when.

A step that finds an intermediate missing or torn (its host crashed; intermediates are not synced) raises
:class:`~services.errors.IntermediateLost`: the job starts over from its uploads (:func:`rewind_job`), at most
:data:`MAX_REWINDS` times.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from services.config import Settings
from services.db.models import Job, Shard, job_recipes, utcnow
from services.db.session import execute_update
from services.errors import FramesMismatch, IntermediateLost, NotFound, RawError
from services.export.recipes import job_model_tier, job_spaces, recipes_of_job
from services.jobs.cameras import PROFILES
from services.jobs.ending import end_unfinished_shards
from services.jobs.finalize import finalize_job, original_name
from services.jobs.plan import (
    PLAN_VERSION,
    PLANNED_KEYS,
    JobPlan,
    ShardPayload,
    phase_count,
    shard_input,
)
from services.jobs.planner import plan_phase_shards, plan_shot
from services.jobs.previews import begin_fast_preview
from services.jobs.quiet import QuietWindow
from services.jobs.states import ACTIVE, RETRY_AT, JobStatus, ShardStatus, Stage, in_batch_lane
from services.jobs.tickets import ShardOutcome, ShardTicket
from services.pipeline.prepare import DecodeLimits, prepare_shot
from services.pipeline.shards import compute_shard
from services.storage import Storage
from services.storage.intermediates import drop_intermediates

log = logging.getLogger(__name__)

MAX_REWINDS = 2
# Progress budget: decode, GPU phases, encode.
DECODE_SHARE, ENCODE_SHARE = 0.1, 0.1


def load_job(session: Session, job_id: str) -> Job:
    job = session.scalars(select(Job).where(Job.id == job_id)).one_or_none()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def _claim(session: Session, job_id: str, from_phase: int, /, **values: object) -> bool:
    """Move an active job on from ``from_phase`` with a conditional UPDATE: exactly one caller wins (the others
    roll back)."""
    won = execute_update(session, update(Job).where(Job.id == job_id, Job.phase == from_phase, Job.status.in_(ACTIVE))
                         .values(**values))
    if not won:
        session.rollback()
    return bool(won)


def fail_job(session: Session, job_id: str, reason: str, storage: Storage | None = None) -> None:
    """Mark a job failed with a reason (no-op when it already ended) and drop its intermediate arrays."""
    session.execute(update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE))
                    .values(status=JobStatus.FAILED, error=reason, stage=Stage.FAILED, finished_at=utcnow()))
    end_unfinished_shards(session, job_id)
    session.commit()
    if storage is not None:
        drop_intermediates(storage, job_id)


def rewind_job(session: Session, storage: Storage, job_id: str, reason: str) -> bool:
    """Start an active job over from ingest after an intermediate was lost; True when the caller must enqueue
    its ingest. The job fails instead after :data:`MAX_REWINDS` rewinds. Shards still running elsewhere find
    their rows gone and stop counting (their phase is no longer the job's)."""
    job = load_job(session, job_id)
    if job.status not in ACTIVE:
        return False
    rewinds = int(job.params.get("rewinds", 0)) + 1
    if rewinds > MAX_REWINDS:
        fail_job(session, job_id, f"{reason} (after {MAX_REWINDS} restarts)", storage)
        return False
    params = {**{k: v for k, v in job.params.items() if k not in PLANNED_KEYS}, "rewinds": rewinds}
    if not _claim(session, job_id, job.phase, status=JobStatus.QUEUED, stage=Stage.QUEUED, phase=-1, progress=0.0,
                  params=params):
        return False  # another step rewound or ended it first
    session.execute(delete(Shard).where(Shard.job_id == job_id))
    session.commit()
    drop_intermediates(storage, job_id)
    log.warning("job %s starts over (%d/%d): %s", job_id, rewinds, MAX_REWINDS, reason)
    return True


def _tickets(job: Job, shards: list[Shard]) -> list[ShardTicket]:
    return [ShardTicket(s.id, job.priority, s.payload.get("gpu_slot")) for s in shards]


def _add_phase_shards(session: Session, job: Job, plan: JobPlan, phase: int, settings: Settings) -> list[Shard]:
    groups_done = sum(1 for s in job.shards if s.phase == plan.phases[phase].groups_phase)
    shards = [Shard(job_id=job.id, phase=phase, index=i, kind=kind.value, payload=payload.to_dict())
              for i, (kind, payload) in enumerate(plan_phase_shards(
                  plan, phase, groups_done=groups_done, strip_rows=settings.strip_rows,
                  strips_per_worker=settings.strips_per_worker))]
    session.add_all(shards)
    return shards


def _start(session: Session, job: Job) -> bool:
    """Queued -> running, conditionally: a cancel committed since the job was loaded is never overwritten."""
    started = execute_update(session, update(Job).where(Job.id == job.id, Job.status.in_(ACTIVE)).values(
        status=JobStatus.RUNNING, stage=Stage.DECODING, started_at=func.coalesce(Job.started_at, utcnow())))
    session.commit()
    if started:
        session.refresh(job)
    return bool(started)


def ingest_job(session: Session, storage: Storage, settings: Settings, job_id: str, n_workers: int,
               gpu_memory_mb: int = 0) -> list[ShardTicket]:
    """Decode, compute the shared shot parameters once, plan phase 0; returns shards to dispatch."""
    job = load_job(session, job_id)
    if job.status not in ACTIVE:
        return []
    if job.phase >= 0:  # an earlier ingest committed its plan: re-dispatch what is still pending (a running shard
        # is held by its worker's heartbeat; the reconciler re-dispatches it if that worker dies)
        return _tickets(job, list(session.scalars(select(Shard).where(
            Shard.job_id == job.id, Shard.phase == job.phase, Shard.status == ShardStatus.PENDING))))
    if not _start(session, job):
        return []
    if settings.fault_ingest_delay_s:  # failure drills: a window to kill the coordinator mid-ingest
        time.sleep(settings.fault_ingest_delay_s)
    t0 = time.perf_counter()
    stack = PROFILES[job.camera].split_strategy == "frame_group"
    recipes = recipes_of_job(job.params, job_recipes(job))
    spaces = job_spaces(recipes)  # the first recipe's space is the primary one
    try:
        shot = prepare_shot(storage, job_id, [f.storage_key for f in job.frames], camera=job.camera,
                            colour_space=spaces[0], extra_spaces=spaces[1:], stack=stack,
                            model_tier=job_model_tier(recipes, settings.model_tier),
                            limits=DecodeLimits(settings.decode_timeout_s, settings.decode_memory_mb,
                                                settings.decode_workers, settings.decode_fast_dng))
    except (RawError, FramesMismatch) as exc:
        fail_job(session, job_id, f"decode failed: {exc.detail}" if isinstance(exc, RawError) else exc.detail,
                 storage)
        return []
    if shot.preview_bins is not None:  # the preview's JPEG is encoded while the shards are planned and sent
        begin_fast_preview(storage, job, shot.frames[0], shot.render, shot.preview_bins, settings.batch_encode_nice)
    plan = plan_shot(job_id, shot, recipes, job.params, settings, stack=stack, n_workers=n_workers,
                     gpu_memory_mb=gpu_memory_mb, batch_lane=in_batch_lane(job.priority, job.batch_id),
                     original=original_name(job), worker_files=storage.renames)
    # Claim the plan: a duplicate ingest (redelivered while this one ran) loses here.
    if not _claim(session, job_id, -1, phase=0):
        return []
    job = load_job(session, job_id)
    timings = {"decode_s": round(shot.decode_s, 4), "prepare_s": round(time.perf_counter() - t0, 4)}
    if len(shot.frames) > 1:
        timings["shifts_s"] = round(shot.shifts_s, 4)
    job.params = {**plan.to_params(), "timings": timings}
    shards = _add_phase_shards(session, job, plan, 0, settings)
    job.stage = Stage.ALIGNING if stack else Stage.ENHANCING
    job.progress = DECODE_SHARE
    session.commit()
    log.info("job %s ingested: %d frame(s) decoded in %.2fs, planned in %.2fs (of which the frames' shifts %.2fs), "
             "%d shard(s)", job_id, len(shot.frames), shot.decode_s, time.perf_counter() - t0 - shot.decode_s,
             shot.shifts_s, len(shards))
    return _tickets(job, shards)


def run_shard(session: Session, storage: Storage, shard_id: int, *, worker: str, gpu: str, device: str,
              delay_s: float = 0.0, quiet: QuietWindow | None = None) -> ShardOutcome:
    """Run a shard unless it is done already; the outcome says whether its phase is now complete. ``quiet``:
    the disk's quiet window, held while the worker writes an interactive shot's output file itself."""
    shard = session.get(Shard, shard_id)
    if shard is None:
        raise NotFound(f"shard {shard_id} not found")
    job = load_job(session, shard.job_id)
    if job.status not in ACTIVE or job.phase != shard.phase:
        return ShardOutcome(job.id, job.priority, False, shard.kind)
    if shard.status != ShardStatus.DONE:
        shard.status, shard.worker, shard.gpu = ShardStatus.RUNNING, worker, gpu
        shard.attempts += 1
        shard.started_at = utcnow()
        session.commit()
        t0 = time.perf_counter()
        if delay_s:
            time.sleep(delay_s)
        plan = JobPlan.from_params(job.params)
        if plan.version != PLAN_VERSION:  # planned by another version of the code: start over with this one
            raise IntermediateLost(job.id, f"plan v{plan.version}",
                                   f"planned by layout version {plan.version}, this worker runs {PLAN_VERSION}")
        hold = partial(quiet.holding, job.id) if quiet is not None and not in_batch_lane(job.priority,
                                                                                          job.batch_id) else None
        compute_shard(storage, shard_input(job.id, plan, shard.phase, shard.index,
                                           ShardPayload.from_dict(shard.payload), hold), device, gpu)
        seconds = time.perf_counter() - t0
        if _ended_meanwhile(session, storage, job.id):
            return ShardOutcome(job.id, job.priority, False, shard.kind)
        session.execute(update(Shard).where(Shard.id == shard_id, Shard.status != ShardStatus.DONE).values(
            status=ShardStatus.DONE, seconds=seconds, finished_at=utcnow(), worker=worker, gpu=gpu, error=None))
        session.commit()
        log.info("shard %s/%s/%s done on %s (gpu %s) in %.2fs", job.id, shard.phase, shard.index, worker, gpu,
                 seconds)
    total, done = session.execute(select(func.count(), func.count().filter(Shard.status == ShardStatus.DONE))
                                  .where(Shard.job_id == job.id, Shard.phase == shard.phase)).one()
    phases = phase_count(job.params)
    progress = DECODE_SHARE + (1 - DECODE_SHARE - ENCODE_SHARE) * (shard.phase + done / total) / phases
    session.execute(update(Job).where(Job.id == job.id, Job.progress < progress).values(progress=progress))
    session.commit()
    return ShardOutcome(job.id, job.priority, done == total, shard.kind)


def _ended_meanwhile(session: Session, storage: Storage, job_id: str) -> bool:
    """A duplicate of a shard (its worker was thought dead) that finishes after the job ended: what it just wrote
    is an orphan, removed with the job's other intermediates."""
    session.rollback()  # see the job as it is now
    if session.scalar(select(Job.status).where(Job.id == job_id)) in ACTIVE:
        return False
    drop_intermediates(storage, job_id)
    return True


def shard_abandoned(session: Session, storage: Storage, shard_id: int) -> bool:
    """Whether a shard that just failed no longer matters: its job ended meanwhile (cancelled, its files removed,
    failed) or moved on, so the failure (its intermediates removed under it) is neither retried nor reported."""
    shard = session.get(Shard, shard_id)
    if shard is None:
        return True
    job = session.get(Job, shard.job_id)
    if job is not None and job.status in ACTIVE and job.phase == shard.phase:
        return False
    if job is not None and job.status not in ACTIVE:
        drop_intermediates(storage, job.id)  # anything the failed shard wrote before it stopped
    return True


def record_shard_failure(session: Session, shard_id: int, reason: str, *, final: bool,
                         storage: Storage | None = None, retry_in_s: float = 0.0) -> None:
    """Note a failed attempt; after the last one the shard and its job fail with the reason. Otherwise the shard
    is pending again and its retry, ``retry_in_s`` from now, already on its way (:func:`note_retry`)."""
    shard = session.get(Shard, shard_id)
    if shard is None:
        return
    shard.error = reason
    shard.status = ShardStatus.FAILED if final else ShardStatus.PENDING
    if not final:
        shard.payload = {**shard.payload, RETRY_AT: time.time() + retry_in_s}
    session.commit()
    if final:
        fail_job(session, shard.job_id, f"shard {shard.phase}/{shard.index} ({shard.kind}) failed: {reason}",
                 storage)


def note_retry(session: Session, shard_id: int, retry_in_s: float) -> None:
    """A shard whose attempt stopped on a transient error (storage, database, broker) and whose retry message
    waits in a worker for ``retry_in_s`` s: pending again, and not lost to the reconciler before then (it would
    send a second message for the same shard)."""
    shard = session.get(Shard, shard_id)
    if shard is None or shard.status in (ShardStatus.DONE, ShardStatus.FAILED):
        return
    shard.status = ShardStatus.PENDING
    shard.payload = {**shard.payload, RETRY_AT: time.time() + retry_in_s}
    session.commit()


def advance_job(session: Session, storage: Storage, settings: Settings, job_id: str,
                quiet: QuietWindow | None = None) -> list[ShardTicket]:
    """Move a job whose current phase is complete to the next phase, or finalize it (``quiet``: the disk's quiet
    window, :func:`finalize_job`); returns shards to dispatch. Safe to call any number of times: the phase moves
    with a conditional UPDATE, so exactly one caller creates the next phase's shards."""
    job = load_job(session, job_id)
    if job.status not in ACTIVE or job.phase < 0:
        return []
    phase, last = job.phase, phase_count(job.params) - 1
    if phase <= last and session.scalar(select(func.count()).where(
            Shard.job_id == job_id, Shard.phase == phase, Shard.status != ShardStatus.DONE)):
        return []
    if phase < last:
        if not _claim(session, job_id, phase, phase=phase + 1, stage=Stage.ENHANCING):
            return []
        job = load_job(session, job_id)
        shards = _add_phase_shards(session, job, JobPlan.from_params(job.params), phase + 1, settings)
        session.commit()
        return _tickets(job, shards)
    # The last GPU phase is done (or a finalize was interrupted): finalize.
    if phase == last:
        claimed = _claim(session, job_id, phase, phase=last + 1, stage=Stage.ENCODING)
        session.commit()
        if not claimed:
            return []
    finalize_job(session, storage, settings, job_id, quiet)
    return []
