"""Finalize, the job's last step: one output file per recipe from the last phase's strips, recorded; the job done.

Called by :func:`services.jobs.flow.advance_job` once the last GPU phase is claimed (stage ``encoding``); safe to
re-run (same names, same bytes, the same rows updated).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from services.config import Settings
from services.db.models import Job, Output, Shard, Station, as_utc, job_recipes, utcnow
from services.db.session import execute_update
from services.errors import IntermediateLost, NotFound
from services.export.derive import ProofSpec, box_factor, fit_long_edge, proof_spec
from services.export.metadata import OutputMetadata
from services.export.naming import NameTokens
from services.export.output import WorkerFile, WrittenOutput, file_spec, write_outputs, written_by_worker
from services.export.recipes import Recipe, recipes_of_job
from services.jobs.lowprio import at_low_priority
from services.jobs.plan import JobPlan, served_without_rows, strip_keys
from services.jobs.previews import final_preview
from services.jobs.quiet import QuietWindow
from services.jobs.retention import drop_if_removed
from services.jobs.states import ACTIVE, JobStatus, Stage, in_batch_lane
from services.pipeline.preview import preview_factor
from services.raw.meta import CaptureInfo
from services.storage import Storage
from services.storage.intermediates import drop_intermediates, load_intermediate
from services.storage.keys import bin_key, preview_sums_key, proof_key, tile_keys, worker_file_keys

log = logging.getLogger(__name__)


@dataclass
class _Strips:
    """The last phase's results per output space, with what the GPU workers made beside them."""

    bands: dict[str, list[tuple[int, np.ndarray]]] = field(default_factory=dict)
    pretiled: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)  # TIFF tiles
    prebinned: dict[str, dict[int, list[tuple[int, np.ndarray]]]] = field(default_factory=dict)  # proof bins
    proofs: dict[ProofSpec, np.ndarray] = field(default_factory=dict)  # resized outputs the workers finished
    preview: list[tuple[int, np.ndarray]] = field(default_factory=list)  # the final preview's block sums (sRGB)
    files: dict[str, WorkerFile] = field(default_factory=dict)  # full-size TIFFs a worker wrote, by space


def _space_bands(storage: Storage, job: Job, plan: JobPlan, strips: list[Shard]) -> _Strips:
    """The last phase's strips of every output space, memory-mapped (tiles are cut from them, no stitched copy),
    and the TIFF tiles and linear-light bins the GPU made beside them (per space, the strips that have them)."""
    found = _Strips()
    spaces = found.bands
    factor = preview_factor(*plan.size)
    for s in strips:
        y0 = int(s.payload["y0"])
        for space, key in strip_keys(job.id, plan.render, s.phase, s.kind, s.index).items():
            spaces.setdefault(space, []).append((y0, load_intermediate(storage, job.id, key)))
            blob_key, index_key = tile_keys(key)
            if space in plan.tile_spaces and storage.exists(index_key):  # no lookups a plan did not ask for
                found.pretiled.setdefault(space, []).append((load_intermediate(storage, job.id, blob_key),
                                                             load_intermediate(storage, job.id, index_key)))
            for bin_space, k in plan.bin_specs:
                if bin_space == space and storage.exists(bin_key(key, k)):
                    found.prebinned.setdefault(space, {}).setdefault(k, []).append(
                        (-(-y0 // k), load_intermediate(storage, job.id, bin_key(key, k))))
            if len(strips) == 1 and any(f.space == space for f in plan.file_specs):
                _worker_file(storage, job.id, key, space, found)
            for spec in plan.proof_specs if len(strips) == 1 else ():  # a strip that held the whole image
                if spec[0] == space and storage.exists(proof_key(key, *spec[1:])):
                    found.proofs[spec] = load_intermediate(storage, job.id, proof_key(key, *spec[1:]))
            if space == "srgb" and (plan.tile_spaces or plan.bin_specs) and storage.exists(
                    preview_sums_key(key, factor)):  # made by a worker that knew to (the plan asked for writer work)
                found.preview.append((-(-y0 // factor), load_intermediate(storage, job.id,
                                                                          preview_sums_key(key, factor))))
    for space, bands in spaces.items():
        covered = sum(rows.shape[0] for _, rows in bands)
        if covered != plan.height:  # the writer checks their widths and order
            raise ValueError(f"{space} strips cover {covered} of the image's {plan.height} rows")
    return found


def _worker_file(storage: Storage, job_id: str, key: str, space: str, found: _Strips) -> None:
    """The full-size TIFF the worker of a whole-image strip wrote from ``key``'s tiles, where its record is."""
    out, record = worker_file_keys(key)
    if not storage.exists(record):
        return
    try:
        with storage.open(record) as f:
            written = json.loads(f.read())
        found.files[space] = WorkerFile(out, str(written["sha256"]), int(written["bytes"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:  # torn by a host crash (not synced): as if absent
        log.warning("job %s: the record of the TIFF its worker wrote (%s) is unreadable (%s); not used", job_id,
                    record, exc)


def _moved(plan: JobPlan, recipes: Sequence[Recipe], found: _Strips, original: str) -> dict[int, WorkerFile]:
    """The recipes (by position) whose file a worker wrote: the one full-size 16-bit deflate TIFF of a space
    whose spec (resolution, names, software) is still the planned one."""
    moved: dict[int, WorkerFile] = {}
    for i, r in enumerate(recipes):
        made = found.files.get(r.colour_space)
        if made is not None and written_by_worker(r) and file_spec(r, original) in plan.file_specs \
                and made not in moved.values():
            moved[i] = made
    return moved


def original_name(job: Job) -> str:
    """The shot's file name as the station sent it (the folder dropped), else the safe stored one: what its
    outputs record (DocumentName, ImageDescription)."""
    first = job.frames[0]
    return PurePosixPath((first.original_name or "").replace("\\", "/")).name or first.name


def _name_tokens(session: Session, job: Job, capture: CaptureInfo) -> NameTokens:
    """The naming tokens of a job's outputs; ``seq`` counts the station's jobs up to this one (creation order)."""
    created = job.created_at
    seq = session.scalar(select(func.count()).where(Job.station_id == job.station_id, or_(
        Job.created_at < created, and_(Job.created_at == created, Job.id <= job.id))))
    station = session.get(Station, job.station_id)
    return NameTokens(station=station.name if station else "", camera=capture.model or job.camera,
                      capture_date=capture.capture_date or as_utc(job.created_at).date().isoformat(),
                      stem=Path(job.frames[0].name).stem, seq=int(seq or 1), job=job.id)


def _record_outputs(session: Session, job_id: str, outs: list[WrittenOutput]) -> None:
    """One Output row per written file; a re-run finalize (same names, same bytes) updates its rows."""
    existing = {o.name: o for o in session.scalars(select(Output).where(Output.job_id == job_id))}
    for out in outs:
        row = existing.get(out.name)
        if row is None:
            session.add(Output(job_id=job_id, name=out.name, storage_key=out.storage_key, sha256=out.sha256,
                               bytes=out.bytes, recipe=out.recipe, media_type=out.media_type))
        else:
            row.storage_key, row.sha256, row.bytes = out.storage_key, out.sha256, out.bytes
            row.recipe, row.media_type = out.recipe, out.media_type


def _mark_done(session: Session, storage: Storage, job: Job, outs: list[WrittenOutput], timings: dict) -> bool:
    """Record the outputs and mark the job done, unless it ended meanwhile: a job cancelled (or failed) while its
    outputs were written gets none (they are removed; found from outside: a job cancelled while encoding read
    ``cancelled`` yet listed and served every output). A re-run finalize of a job already done records them again."""
    done = execute_update(session, update(Job).where(Job.id == job.id, Job.status.in_(ACTIVE)).values(
        status=JobStatus.DONE, stage=Stage.DONE, progress=1.0, finished_at=utcnow(),
        params={**job.params, "timings": timings}))
    if not done and session.scalar(select(Job.status).where(Job.id == job.id)) != JobStatus.DONE:
        session.rollback()
        for out in outs:
            storage.delete_prefix(out.storage_key)
        drop_intermediates(storage, job.id)
        log.info("job %s ended while its outputs were written: %d output(s) removed", job.id, len(outs))
        return False
    _record_outputs(session, job.id, outs)
    session.commit()
    return True


def _check_lean(job_id: str, plan: JobPlan, recipes: Sequence[Recipe], found: _Strips,
                moved: Mapping[int, WorkerFile] | None = None) -> None:
    """A recipe that needs the full rows of a space the workers rendered lean, the bins of one whose worker
    finished other resized outputs instead, or the tiles of one whose worker wrote another TIFF from them (a
    studio's recipe changed after the job was planned): the job starts over, re-planned for the recipes it has
    now (IntermediateLost)."""
    for i, r in enumerate(recipes):
        if r.colour_space not in plan.lean_spaces or i in (moved or {}):
            continue
        missing = not served_without_rows(r, plan.tile_spaces, plan.bin_specs, *plan.size)
        if not missing and r.long_edge is None and r.colour_space in found.files:
            missing = r.colour_space not in found.pretiled  # its worker wrote a file instead of storing the tiles
        if not missing and r.long_edge is not None and proof_spec(r) not in found.proofs:
            h, w = fit_long_edge(*plan.size, r.long_edge)
            missing = box_factor(*plan.size, h, w) not in found.prebinned.get(r.colour_space, {})
        if missing:
            raise IntermediateLost(job_id, f"{r.colour_space} strips", f"recipe {r.name!r} needs the full render "
                                   "and the strips were rendered for files made from GPU tiles and bins only")


def _finalize_split(begun: dt.datetime, strips: Sequence[Shard], read_s: float) -> dict[str, float]:
    """The finalize's first parts in a job's timings: ``finalize_wait_s`` (the last strip finished -> this finalize
    began: the result's way to the coordinator and its slot) and ``finalize_read_s`` (the strips' rows, tiles and
    bins found and read back)."""
    ends = [as_utc(s.finished_at) for s in strips if s.finished_at is not None]
    out = {"finalize_read_s": round(read_s, 4)}
    if ends:
        out["finalize_wait_s"] = round(max((begun - max(ends)).total_seconds(), 0.0), 4)
    return out


def finalize_job(session: Session, storage: Storage, settings: Settings, job_id: str,
                 quiet: QuietWindow | None = None) -> None:
    """Write one output per recipe from the last phase's strips (of each recipe's colour space), record them,
    mark the job done, drop intermediates. ``quiet``: an interactive job's outputs open the disk's quiet window
    until they are recorded; a batch-lane job's TIFF writes wait while it is open."""
    begun, t_begun = utcnow(), time.perf_counter()
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    plan = JobPlan.from_params(job.params)
    strips = list(session.scalars(select(Shard).where(Shard.job_id == job_id, Shard.phase == len(plan.phases) - 1)
                                  .order_by(Shard.index)))
    found = _space_bands(storage, job, plan, strips)
    split = _finalize_split(begun, strips, time.perf_counter() - t_begun)
    spaces = found.bands
    t0 = time.perf_counter()
    recipes = recipes_of_job(job.params, job_recipes(job))
    capture, original = plan.capture, original_name(job)
    moved = _moved(plan, recipes, found, original)
    _check_lean(job_id, plan, recipes, found, moved)
    naming = job.params.get("naming")
    if naming:  # the job's own template for every recipe (validated at creation)
        recipes = [r.model_copy(update={"naming": naming}) for r in recipes]
    tokens, meta = _name_tokens(session, job, capture), OutputMetadata(capture, original)
    batch_lane = in_batch_lane(job.priority, job.batch_id)
    # A batch shot's encode yields the cores to an interactive shot's (measured: an interactive 80 MP frame's TIFF
    # took 4.0 s instead of 1.05 s beside a batch's encodes at the same priority).
    # An interactive shot's files reach the disk first: batch-lane writes wait while they are written.
    with quiet.holding(job_id) if quiet is not None and not batch_lane else contextlib.nullcontext():
        pause = quiet.waiter() if quiet is not None and batch_lane else None
        outs = at_low_priority(lambda: write_outputs(storage, job_id, spaces, recipes, tokens, meta,
                                                     threads=settings.tiff_threads, pretiled=found.pretiled,
                                                     prebinned=found.prebinned, proofs=found.proofs, pause=pause,
                                                     moved=moved),
                               settings.batch_encode_nice if batch_lane else 0)
        t_written = time.perf_counter()
        timings = {**job.params.get("timings", {}), **split, "encode_s": round(t_written - t0, 4)}
        if not _mark_done(session, storage, job, outs, timings):
            return
    t1 = time.perf_counter()
    final_preview(session, storage, job_id, spaces.get("srgb"), nice=settings.batch_encode_nice if batch_lane else 0,
                  premade=found.preview, orientation=capture.orientation)
    t2 = time.perf_counter()
    drop_intermediates(storage, job_id)
    drop_if_removed(session, storage, job_id)  # DELETE .../files came while the final preview was written
    log.info("job %s done: %s (%d bytes; outputs written and recorded in %.2fs; final preview %.2fs, "
             "intermediates removed %.2fs; the record and commit %.2fs of the first)", job_id,
             ", ".join(o.name for o in outs), sum(o.bytes for o in outs), t1 - t0, t2 - t1, time.perf_counter() - t2,
             t1 - t_written)
