"""The job state machine: ingest -> GPU phases (frame groups, strips) -> finalize.

Every step is idempotent and decided from database rows, never from a queue counter: a task that runs twice
writes the same arrays (atomically) and counts once. The functions return what the caller must enqueue after
the commit, so this module knows nothing about Celery.

Uploads and outputs are durable (fsync before the database says so). Intermediates (decoded frames, frame-group
accumulators, strips) are written atomically but not synced: syncing a stack's 1.6 GB of accumulators cost
about 1.1 s of its 4 s on an H200 host. A process crash loses nothing (the page cache stays); a host crash can
lose them, and a step that finds one missing or torn raises :class:`IntermediateLost`: the job starts over from
its uploads (:func:`rewind_job`), at most :data:`MAX_REWINDS` times.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from services.config import Settings
from services.db.models import Job, Output, Shard, as_utc, utcnow
from services.db.session import execute_update
from services.errors import NotFound
from services.export.recipes import get_recipe
from services.export.tiff import write_tiff
from services.jobs.cameras import PROFILES
from services.jobs.planner import parse_split_ratio, plan_frame_groups, plan_strips, strip_count
from services.pipeline.render import RenderParams, render_strip
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import frame_shifts, merge_frame_group, pixel_shift_offsets, render_stack_strip
from services.pipeline.transfer import prefault
from services.raw.decode import decode_raw
from services.raw.errors import RawError
from services.raw.meta import RawMeta
from services.storage import Storage

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class ShardTicket:
    """What the queue needs to dispatch a shard: its id, the job's priority, an optional GPU slot."""

    shard_id: int
    priority: str
    slot: int | None


@dataclass(frozen=True)
class ShardOutcome:
    job_id: str
    priority: str
    phase_complete: bool
MAX_REWINDS = 2
_PLANNED = ("frames", "render", "plan", "n_workers", "ratios", "size")  # what ingest adds to a job's params


class IntermediateLost(Exception):
    """An intermediate array a step needs is missing or torn (its host crashed before writing it back)."""

    def __init__(self, job_id: str, key: str, detail: str) -> None:
        super().__init__(f"intermediate {key} lost: {detail}")
        self.job_id = job_id


def load_intermediate(storage: Storage, job_id: str, key: str) -> np.ndarray:
    """A job's intermediate array (memory-mapped); :class:`IntermediateLost` when it is gone or unreadable."""
    try:
        return storage.load_array(key)
    except (OSError, ValueError, EOFError) as exc:  # missing, truncated header, short data
        raise IntermediateLost(job_id, key, f"{type(exc).__name__}: {exc}") from exc


def rewind_job(session: Session, storage: Storage, job_id: str, reason: str) -> bool:
    """Start an active job over from ingest after an intermediate was lost; True when the caller must enqueue
    its ingest. The job fails instead after :data:`MAX_REWINDS` rewinds. Shards still running elsewhere find
    their rows gone and stop counting (their phase is no longer the job's)."""
    job = _load_job(session, job_id)
    if job.status not in ACTIVE:
        return False
    rewinds = int(job.params.get("rewinds", 0)) + 1
    if rewinds > MAX_REWINDS:
        fail_job(session, job_id, f"{reason} (after {MAX_REWINDS} restarts)", storage)
        return False
    claimed = execute_update(
        session,
        update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE), Job.phase == job.phase)
        .values(status="queued", stage="queued", phase=-1, progress=0.0,
                params={**{k: v for k, v in job.params.items() if k not in _PLANNED}, "rewinds": rewinds})
    )
    if not claimed:  # another step rewound or ended it first
        session.rollback()
        return False
    session.execute(delete(Shard).where(Shard.job_id == job_id))
    session.commit()
    remove_intermediates(storage, job_id)
    log.warning("job %s starts over (%d/%d): %s", job_id, rewinds, MAX_REWINDS, reason)
    return True


# Progress budget: decode, GPU phases, encode.
DECODE_SHARE, ENCODE_SHARE = 0.1, 0.1


def raw_key(job_id: str, index: int) -> str:
    return f"jobs/{job_id}/raw/{index:02d}.npy"


def shard_key(job_id: str, phase: int, kind: str, index: int) -> str:
    return f"jobs/{job_id}/p{phase}/{kind}_{index:03d}.npy"


def _load_job(session: Session, job_id: str, *, lock: bool = False) -> Job:
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    job = session.scalars(stmt).one_or_none()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def fail_job(session: Session, job_id: str, reason: str, storage: Storage | None = None) -> None:
    """Mark a job failed with a reason (no-op when it already ended) and drop its intermediate arrays."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(ACTIVE))
        .values(status="failed", error=reason, stage="failed", finished_at=utcnow())
    )
    session.commit()
    if storage is not None:
        remove_intermediates(storage, job_id)


def remove_intermediates(storage: Storage, job_id: str) -> None:
    """Delete decoded frames and shard results; uploads and outputs stay."""
    for prefix in ("raw", "p0", "p1", "p2", "p3"):
        storage.delete_prefix(f"jobs/{job_id}/{prefix}")


# --------------------------------------------------------------------------------------------- ingest


def _decode_frames(job: Job, storage: Storage, settings: Settings) -> list[RawMeta]:
    """Decode every frame in a sandboxed child process (several at once)."""

    def decode_one(index: int) -> RawMeta:
        with storage.path_writer(raw_key(job.id, index)) as tmp:
            return decode_raw(
                storage.local_path(job.frames[index].storage_key),
                tmp,
                timeout_s=settings.decode_timeout_s,
                memory_mb=settings.decode_memory_mb,
            )

    workers = max(1, min(len(job.frames), settings.decode_workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="decode") as pool:
        return list(pool.map(decode_one, range(len(job.frames))))


def _tickets(job: Job, shards: list[Shard]) -> list[ShardTicket]:
    return [ShardTicket(s.id, job.priority, s.payload.get("gpu_slot")) for s in shards]


def ingest_job(
    session: Session, storage: Storage, settings: Settings, job_id: str, n_workers: int
) -> list[ShardTicket]:
    """Decode, compute the shared shot parameters once, plan phase 0; returns shard ids to dispatch."""
    job = _load_job(session, job_id)
    if job.status not in ACTIVE:
        return []
    if job.phase >= 0:  # an earlier ingest committed its plan: re-dispatch what is still pending
        return _pending_shards(session, job)
    job.status, job.stage = "running", "decoding"
    job.started_at = job.started_at or utcnow()
    session.commit()

    t0 = time.perf_counter()
    try:
        metas = _decode_frames(job, storage, settings)
    except RawError as exc:
        fail_job(session, job_id, f"decode failed: {exc.reason}", storage)
        return []
    ref = metas[0]
    for i, m in enumerate(metas[1:], start=1):
        if (m.width, m.height, m.cfa) != (ref.width, ref.height, ref.cfa):
            fail_job(session, job_id, f"frame {i} ({m.width}x{m.height} {m.cfa}) does not match frame 0 "
                                      f"({ref.width}x{ref.height} {ref.cfa})", storage)
            return []

    t_decode = time.perf_counter() - t0
    params = replace(shot_render_params(ref, storage.load_array(raw_key(job_id, 0)),
                                        get_recipe(job.recipe).colour_space, camera=job.camera), frames=len(metas))
    profile = PROFILES[job.camera]
    ratios = parse_split_ratio(settings.split_ratio)
    plan: list[dict] = []
    if profile.split_strategy == "frame_group":
        offsets = None
        if len(metas) == 4:  # a 4-shot one-pixel pattern is combined without demosaicing (pixel shift)
            frames = [(storage.load_array(raw_key(job_id, i)), m) for i, m in enumerate(metas)]
            offsets = pixel_shift_offsets(frame_shifts(frames[0], frames))
        plan.append({"kind": "frame_group", "pixel_shift": offsets})
        # Strips of a stack fuse their own rows of every group's accumulator (no fused image on the coordinator).
        plan.append({"kind": "strip", "groups_phase": 0, "pixel_shift": offsets is not None})
    else:
        plan.append({"kind": "strip", "source": raw_key(job_id, 0), "normalized": False, "noise_scale": 1.0})

    # Claim the plan with a conditional UPDATE: a duplicate ingest (redelivered while this one ran) loses here.
    claimed = execute_update(
        session, update(Job).where(Job.id == job_id, Job.phase == -1, Job.status.in_(ACTIVE)).values(phase=0)
    )
    if not claimed:
        session.rollback()
        return []
    job = _load_job(session, job_id)
    job.params = {
        **job.params,
        "frames": {str(i): m.to_dict() for i, m in enumerate(metas)},
        "render": params.to_dict(),
        "plan": plan,
        "n_workers": n_workers,
        "ratios": ratios,
        "size": [ref.height, ref.width],
    }
    shards = _plan_phase(job, 0, n_workers, ratios, settings)
    session.add_all(shards)
    job.stage = "aligning" if plan[0]["kind"] == "frame_group" else "enhancing"
    job.progress = DECODE_SHARE
    session.commit()
    log.info("job %s ingested: %d frame(s) decoded in %.2fs, planned in %.2fs, %d shard(s)", job_id, len(metas),
             t_decode, time.perf_counter() - t0 - t_decode, len(shards))
    return _tickets(job, shards)


def _plan_phase(job: Job, phase: int, n_workers: int, ratios: list[float] | None, settings: Settings) -> list[Shard]:
    spec = job.params["plan"][phase]
    height = int(job.params["size"][0])
    use_ratio = ratios if ratios and len(ratios) == n_workers else None
    if spec["kind"] == "frame_group":
        groups = plan_frame_groups(len(job.frames), n_workers, use_ratio)
        return [Shard(job_id=job.id, phase=phase, index=i, kind="frame_group",
                      payload={"frames": g, "gpu_slot": i if use_ratio else None})
                for i, g in enumerate(groups)]
    n = len(use_ratio) if use_ratio else strip_count(height, settings.strip_rows, n_workers,
                                                      settings.strips_per_worker)
    strips = plan_strips(height, n, use_ratio)
    extra = {}
    if spec.get("groups_phase") is not None:  # a stack's strips read every frame group's accumulator
        extra["groups"] = sum(1 for s in job.shards if s.phase == spec["groups_phase"])
    return [Shard(job_id=job.id, phase=phase, index=i, kind="strip",
                  payload={"y0": y0, "y1": y1, "gpu_slot": i if use_ratio else None, **extra})
            for i, (y0, y1) in enumerate(strips)]


def _pending_shards(session: Session, job: Job) -> list[ShardTicket]:
    return _tickets(job, list(session.scalars(
        select(Shard).where(Shard.job_id == job.id, Shard.phase == job.phase, Shard.status != "done")
    )))


# --------------------------------------------------------------------------------------------- shards


def _phase_render_params(job: Job, spec: dict) -> RenderParams:
    params = RenderParams.from_dict(job.params["render"])
    scale = float(spec.get("noise_scale", 1.0))
    return replace(params, noise_shot=params.noise_shot * scale, noise_read=params.noise_read * scale)


def compute_shard(job: Job, shard: Shard, storage: Storage, device: str) -> None:
    """Run one shard's GPU work and store its result (atomically, same bytes every time)."""
    spec = job.params["plan"][shard.phase]
    out_key = shard_key(job.id, shard.phase, shard.kind, shard.index)
    if shard.kind == "strip" and spec.get("groups_phase") is not None:
        groups = [load_intermediate(storage, job.id, shard_key(job.id, int(spec["groups_phase"]), "frame_group", i))
                  for i in range(int(shard.payload["groups"]))]
        result = render_stack_strip(groups, shard.payload["y0"], shard.payload["y1"], _phase_render_params(job, spec),
                                    device=device, pixel_shift=bool(spec["pixel_shift"]))
    elif shard.kind == "strip":
        source = load_intermediate(storage, job.id, spec["source"])
        result = render_strip(source, shard.payload["y0"], shard.payload["y1"], _phase_render_params(job, spec),
                              device=device, normalized=bool(spec["normalized"]))
    else:
        indices = list(shard.payload["frames"])
        metas = {i: RawMeta.from_dict(job.params["frames"][str(i)]) for i in [0, *indices]}
        frames = [(load_intermediate(storage, job.id, raw_key(job.id, i)), metas[i]) for i in indices]
        reference = (load_intermediate(storage, job.id, raw_key(job.id, 0)), metas[0])
        offsets = spec.get("pixel_shift")
        channels = 6 if offsets else 5
        # The accumulator goes from the GPU straight into the file's pages (a memory map), not durable (see above).
        # Its pages are touched on threads while the GPU merges (prefault): allocating them cost 0.3 s on the host.
        with storage.array_writer(out_key, (channels, *reference[0].shape), np.int32, durable=False) as out:
            merge_frame_group(reference, frames, device=device, stack_size=len(job.frames), positions=indices,
                              params=RenderParams.from_dict(job.params["render"]),
                              pixel_shift=[tuple(offsets[i]) for i in indices] if offsets else None, out=out,
                              out_ready=prefault(out))
        return
    storage.save_array(out_key, result, durable=False)  # an intermediate: see the module's docstring


def run_shard(session: Session, storage: Storage, shard_id: int, *, worker: str, gpu: str, device: str,
              delay_s: float = 0.0) -> ShardOutcome:
    """Run a shard unless it is done already; the outcome says whether its phase is now complete."""
    shard = session.get(Shard, shard_id)
    if shard is None:
        raise NotFound(f"shard {shard_id} not found")
    job = _load_job(session, shard.job_id)
    if job.status not in ACTIVE or job.phase != shard.phase:
        return ShardOutcome(job.id, job.priority, False)
    if shard.status != "done":
        shard.status, shard.worker, shard.gpu = "running", worker, gpu
        shard.attempts += 1
        shard.started_at = utcnow()
        session.commit()
        t0 = time.perf_counter()
        if delay_s:
            time.sleep(delay_s)
        compute_shard(job, shard, storage, device)
        seconds = time.perf_counter() - t0
        session.execute(
            update(Shard).where(Shard.id == shard_id, Shard.status != "done")
            .values(status="done", seconds=seconds, finished_at=utcnow(), worker=worker, gpu=gpu, error=None)
        )
        session.commit()
        log.info("shard %s/%s/%s done on %s (gpu %s) in %.2fs", job.id, shard.phase, shard.index, worker, gpu,
                 seconds)
    total, done = session.execute(
        select(func.count(), func.count().filter(Shard.status == "done"))
        .where(Shard.job_id == job.id, Shard.phase == shard.phase)
    ).one()
    n_phases = len(job.params["plan"])
    progress = DECODE_SHARE + (1 - DECODE_SHARE - ENCODE_SHARE) * (shard.phase + done / total) / n_phases
    session.execute(update(Job).where(Job.id == job.id, Job.progress < progress).values(progress=progress))
    session.commit()
    return ShardOutcome(job.id, job.priority, done == total)


def record_shard_failure(session: Session, shard_id: int, reason: str, *, final: bool,
                         storage: Storage | None = None) -> None:
    """Note a failed attempt; after the last one the shard and its job fail with the reason."""
    shard = session.get(Shard, shard_id)
    if shard is None:
        return
    shard.error = reason
    if final:
        shard.status = "failed"
        session.commit()
        fail_job(session, shard.job_id, f"shard {shard.phase}/{shard.index} ({shard.kind}) failed: {reason}",
                 storage)
    else:
        shard.status = "pending"
        session.commit()


# --------------------------------------------------------------------------------------------- advance


def advance_job(session: Session, storage: Storage, settings: Settings, job_id: str) -> list[ShardTicket]:
    """Move a job whose current phase is complete to the next phase (or finalize it).

    Returns shard ids to dispatch. Safe to call any number of times: the phase moves with a conditional
    UPDATE, so exactly one caller creates the next phase's shards.
    """
    job = _load_job(session, job_id)
    if job.status not in ACTIVE or job.phase < 0:
        return []
    plan = job.params["plan"]
    phase = job.phase
    if phase < len(plan):
        remaining = session.scalar(
            select(func.count()).where(Shard.job_id == job_id, Shard.phase == phase, Shard.status != "done")
        )
        if remaining:
            return []
    if phase + 1 < len(plan):
        claimed = execute_update(
            session,
            update(Job).where(Job.id == job_id, Job.phase == phase, Job.status.in_(ACTIVE))
            .values(phase=phase + 1, stage="enhancing")
        )
        if not claimed:
            session.rollback()
            return []
        job = _load_job(session, job_id)
        shards = _plan_phase(job, phase + 1, int(job.params["n_workers"]), job.params.get("ratios"), settings)
        session.add_all(shards)
        session.commit()
        return _tickets(job, shards)
    # The last GPU phase is done (or a finalize was interrupted): finalize.
    if phase < len(plan):
        claimed = execute_update(
            session,
            update(Job).where(Job.id == job_id, Job.phase == phase, Job.status.in_(ACTIVE))
            .values(phase=len(plan), stage="encoding")
        )
        session.commit()
        if not claimed:
            return []
    finalize_job(session, storage, settings, job_id)
    return []


def finalize_job(session: Session, storage: Storage, settings: Settings, job_id: str) -> None:
    """Write the TIFF from the strips with a thread pool, record the output, mark the job done."""
    job = _load_job(session, job_id)
    last = len(job.params["plan"]) - 1
    height = int(job.params["size"][0])
    strips = session.scalars(
        select(Shard).where(Shard.job_id == job_id, Shard.phase == last).order_by(Shard.index)
    ).all()
    # The strips' rows, memory-mapped: the TIFF's tiles are cut from them (no stitched copy of the image).
    bands = [(int(s.payload["y0"]), load_intermediate(storage, job_id, shard_key(job_id, last, "strip", s.index)))
             for s in strips]
    if sum(rows.shape[0] for _, rows in bands) != height:  # write_tiff checks their widths and order
        raise ValueError(f"strips cover {sum(rows.shape[0] for _, rows in bands)} of the image's {height} rows")
    recipe = get_recipe(job.recipe)
    t0 = time.perf_counter()
    name = f"{Path(job.frames[0].name).stem}.tif"
    key = f"jobs/{job_id}/out/{name}"
    sha, size = write_tiff(storage, key, bands, colour_space=recipe.colour_space, compression=recipe.compression,
                           threads=settings.tiff_threads)
    existing = session.scalars(select(Output).where(Output.job_id == job_id, Output.name == name)).one_or_none()
    if existing is None:
        session.add(Output(job_id=job_id, name=name, storage_key=key, sha256=sha, bytes=size))
    else:  # a finalize that was interrupted after recording the output: same bytes, same row
        existing.sha256, existing.bytes = sha, size
    session.execute(
        update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE))
        .values(status="done", stage="done", progress=1.0, finished_at=utcnow())
    )
    session.commit()
    seconds = time.perf_counter() - t0
    remove_intermediates(storage, job_id)
    log.info("job %s done: %s (%d bytes, TIFF written and recorded in %.2fs)", job_id, name, size, seconds)


# --------------------------------------------------------------------------------------------- reconcile


@dataclass
class Repairs:
    """Work the reconciler found lost (a message dropped, a worker gone) and re-dispatches."""

    ingest: list[tuple[str, str]]  # (job id, priority)
    shards: list[ShardTicket]
    advance: list[tuple[str, str]]


def reconcile(session: Session, *, alive_workers: set[str], coordinator_backlog: int, stale_after_s: float
              ) -> Repairs:
    """Find work that no message will ever deliver again and say what to re-dispatch.

    Everything it returns is idempotent to run twice, so a duplicate of a message still in flight is harmless:
    - shards marked running on a worker whose heartbeat is gone (redelivered to the shared GPU queue);
    - shards pinned to a worker's own queue (split_ratio) whose worker is gone;
    - running jobs whose current phase is complete but that did not advance;
    - queued jobs never ingested while the coordinator queue is empty (their message was lost).
    """
    now = utcnow()
    stale = now - dt.timedelta(seconds=stale_after_s)
    repairs = Repairs([], [], [])
    jobs = session.scalars(select(Job).where(Job.status.in_(ACTIVE))).all()
    for job in jobs:
        created = as_utc(job.created_at)
        if job.status == "queued" and job.phase < 0:
            if coordinator_backlog == 0 and created < stale:
                repairs.ingest.append((job.id, job.priority))
            continue
        if job.phase < 0 or job.phase >= len(job.params.get("plan", [])):
            continue
        shards = [s for s in job.shards if s.phase == job.phase]
        if shards and all(s.status == "done" for s in shards):
            last = max((s.finished_at for s in shards if s.finished_at), default=None)
            if last is not None and as_utc(last) < stale:
                repairs.advance.append((job.id, job.priority))
            continue
        for s in shards:
            lost_runner = s.status == "running" and s.worker not in alive_workers
            lost_pin = s.status == "pending" and s.payload.get("gpu_slot") is not None
            started = s.started_at or created
            if (lost_runner or lost_pin) and as_utc(started) < stale:
                repairs.shards.append(ShardTicket(s.id, job.priority, None))
    return repairs
