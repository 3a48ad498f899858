"""The job's preview, kept up to date by the state machine: a fast one at ingest (from the decoded reference
mosaic, before any GPU work), replaced at finalize by a downscale of the final render. A preview that cannot be
made is logged and skipped: it never fails a job."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from services.db.models import Job, Output
from services.export.preview import write_preview
from services.jobs.lowprio import at_low_priority
from services.jobs.plan import JobPlan, is_planned
from services.jobs.states import ACTIVE, Priority
from services.metrics import BYTES_WRITTEN, PREVIEW_SECONDS
from services.pipeline.preview import linear_preview, mosaic_preview, strips_preview
from services.pipeline.render import RenderParams
from services.raw.colour import render_colour, white_balance_neutral
from services.raw.meta import RawMeta
from services.storage.base import Storage
from services.storage.keys import raw_key

log = logging.getLogger(__name__)


def _record(session: Session, job_id: str, etag: str, kind: str) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(preview_etag=etag, preview_kind=kind))
    session.commit()


def fast_preview(session: Session, storage: Storage, job_id: str, meta: RawMeta, render: RenderParams,
                 nice: int = 0) -> None:
    """Once the job is planned: the preview from frame 0's decoded mosaic (binned, white balanced, the shot's
    colour, sRGB), made after the shards were dispatched, so the GPUs never wait for it; computed ``nice`` lower
    (a batch-lane job's)."""
    t0 = time.perf_counter()

    def make() -> str:
        mosaic = storage.load_array(raw_key(job_id, 0))
        if render.space == "srgb":  # the shot's own white balance and matrix, computed once at ingest
            gains, srgb_from_wb_cam = render.gains, np.asarray(render.rgb_cam)
        else:
            colour = render_colour(meta, "srgb", neutral=white_balance_neutral(meta, mosaic))
            gains, srgb_from_wb_cam = colour.gains, colour.out_from_wb_cam
        if meta.is_linear:
            rgb = linear_preview(mosaic, black=render.black, white=render.white, gains=gains,
                                 srgb_from_wb_cam=srgb_from_wb_cam)
        else:
            rgb = mosaic_preview(mosaic, cfa=meta.cfa, black=render.black, white=render.white, gains=gains,
                                 srgb_from_wb_cam=srgb_from_wb_cam)
        return write_preview(storage, job_id, rgb)

    try:
        etag = at_low_priority(make, nice)
    except Exception:  # noqa: BLE001 - a preview is a convenience: the render goes on without it
        log.exception("job %s: fast preview failed", job_id)
        return
    _record(session, job_id, etag, "fast")
    PREVIEW_SECONDS.labels(kind="fast").observe(time.perf_counter() - t0)
    log.info("job %s: fast preview in %.3fs", job_id, time.perf_counter() - t0)


def final_preview(session: Session, storage: Storage, job_id: str,
                  srgb_bands: Sequence[tuple[int, np.ndarray]] | None, nice: int = 0) -> None:
    """At finalize: the preview becomes a downscale of the final render's sRGB strips (``srgb_bands``; a job
    whose recipes render no sRGB keeps its fast preview, which is sRGB); computed ``nice`` lower (batch lane)."""
    t0 = time.perf_counter()
    BYTES_WRITTEN.inc(sum(session.scalars(select(Output.bytes).where(Output.job_id == job_id))))
    if srgb_bands is None:
        return
    bands = srgb_bands
    try:
        etag = at_low_priority(lambda: write_preview(storage, job_id, strips_preview(bands)), nice)
    except Exception:  # noqa: BLE001 - as above
        log.exception("job %s: final preview failed", job_id)
        return
    _record(session, job_id, etag, "final")
    PREVIEW_SECONDS.labels(kind="final").observe(time.perf_counter() - t0)


def preview_ingested(session: Session, storage: Storage, job_id: str, batch_nice: int = 0) -> None:
    """The fast preview of a job just planned (called once its shards are dispatched); nothing for a job that
    has a preview already, was never planned or ended. A batch-lane job's is made ``batch_nice`` lower."""
    job = session.get(Job, job_id)
    if job is None or job.preview_etag is not None or job.status not in ACTIVE or not is_planned(job.params):
        return
    plan = JobPlan.from_params(job.params)
    batch_lane = job.batch_id is not None or job.priority == Priority.BATCH
    fast_preview(session, storage, job_id, plan.frames[0], plan.render, nice=batch_nice if batch_lane else 0)
