"""The job's preview, kept up to date by the state machine: a fast one at ingest (from the decoded reference
mosaic, before any GPU work), replaced at finalize by a downscale of the final render. A preview that cannot be
made is logged and skipped: it never fails a job."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from services.db.models import Job, Output
from services.export.preview import encode_jpeg, store_preview, write_preview
from services.jobs.lowprio import at_low_priority
from services.jobs.plan import JobPlan, is_planned
from services.jobs.states import ACTIVE, in_batch_lane
from services.metrics import BYTES_WRITTEN, PREVIEW_SECONDS
from services.pipeline.preview import (
    MosaicBinner,
    binned_preview,
    linear_preview,
    mosaic_preview,
    strips_preview,
)
from services.pipeline.render import RenderParams
from services.raw.colour import render_colour, white_balance_neutral
from services.raw.meta import RawMeta
from services.storage.base import Storage
from services.storage.keys import raw_key

log = logging.getLogger(__name__)


# Fast previews begun at ingest (:func:`begin_fast_preview`), kept in this process until the step that follows in
# the same task stores them (a few at most: an ingest that fails before that leaves its entry to be pushed out).
_PENDING: OrderedDict[str, Future[bytes]] = OrderedDict()
_PENDING_LOCK = threading.Lock()
_PENDING_KEPT = 4
PENDING_TIMEOUT_S = 60.0  # a preview never holds its ingest task longer (tens of ms normally)


def _lane_nice(job: Job, batch_nice: int) -> int:
    return batch_nice if in_batch_lane(job.priority, job.batch_id) else 0


def _srgb_colour(meta: RawMeta, render: RenderParams, mosaic: Callable[[], np.ndarray]
                 ) -> tuple[Sequence[float], np.ndarray]:
    """The preview's white balance gains and camera -> sRGB matrix: the shot's own when it renders to sRGB
    (computed once at ingest), else the same white decision for sRGB."""
    if render.space == "srgb":
        return render.gains, np.asarray(render.rgb_cam)
    colour = render_colour(meta, "srgb", neutral=white_balance_neutral(meta, mosaic()))
    return colour.gains, colour.out_from_wb_cam


def shot_orientation(meta: RawMeta) -> int:
    """The shot's EXIF Orientation as the file recorded it (1 where it did not)."""
    return meta.capture.orientation if meta.capture is not None else 1


def begin_fast_preview(storage: Storage, job: Job, meta: RawMeta, render: RenderParams, bins: MosaicBinner,
                       batch_nice: int = 0) -> None:
    """At ingest, once frame 0 is decoded and binned (on the way, :class:`MosaicBinner`) and the shot's colour
    is known: encode the fast preview's JPEG on a thread of its own while ingest plans, commits and dispatches the
    shards; :func:`preview_ingested` stores it after the dispatch. A batch-lane job's at ``batch_nice``."""
    job_id, nice = job.id, _lane_nice(job, batch_nice)

    def encode() -> bytes:
        gains, matrix = _srgb_colour(meta, render, lambda: storage.load_array(raw_key(job_id, 0)))
        return encode_jpeg(binned_preview(bins, cfa=meta.cfa, black=render.black, white=render.white,
                                          gains=gains, srgb_from_wb_cam=matrix), orientation=shot_orientation(meta))

    future: Future[bytes] = Future()

    def run() -> None:
        try:
            future.set_result(at_low_priority(encode, nice))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever stores the preview
            future.set_exception(exc)

    with _PENDING_LOCK:
        _PENDING[job_id] = future
        while len(_PENDING) > _PENDING_KEPT:
            _PENDING.popitem(last=False)
    threading.Thread(target=run, name="strata-fast-preview", daemon=True).start()


def _take_pending(job_id: str) -> Future[bytes] | None:
    with _PENDING_LOCK:
        return _PENDING.pop(job_id, None)


def _record(session: Session, job_id: str, etag: str, kind: str) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(preview_etag=etag, preview_kind=kind))
    session.commit()


def fast_preview(session: Session, storage: Storage, job_id: str, meta: RawMeta, render: RenderParams,
                 nice: int = 0) -> None:
    """Once the job is planned and its shards dispatched (the GPUs never wait for it): store the JPEG that
    :func:`begin_fast_preview` encoded meanwhile; without one (LibRaw decoded the file, another process ingested
    it, a linear DNG) make it here from frame 0's stored mosaic (binned, white balanced, the shot's colour, sRGB),
    ``nice`` lower (a batch-lane job's)."""
    t0 = time.perf_counter()
    pending = _take_pending(job_id)

    def make() -> str:
        mosaic = storage.load_array(raw_key(job_id, 0))
        gains, matrix = _srgb_colour(meta, render, lambda: mosaic)
        if meta.is_linear:
            rgb = linear_preview(mosaic, black=render.black, white=render.white, gains=gains, srgb_from_wb_cam=matrix)
        else:
            rgb = mosaic_preview(mosaic, cfa=meta.cfa, black=render.black, white=render.white, gains=gains,
                                 srgb_from_wb_cam=matrix)
        return write_preview(storage, job_id, rgb, shot_orientation(meta))

    try:
        etag = (store_preview(storage, job_id, pending.result(timeout=PENDING_TIMEOUT_S)) if pending is not None
                else at_low_priority(make, nice))
    except Exception:  # noqa: BLE001 - a preview is a convenience: the render goes on without it
        log.exception("job %s: fast preview failed", job_id)
        return
    _record(session, job_id, etag, "fast")
    PREVIEW_SECONDS.labels(kind="fast").observe(time.perf_counter() - t0)
    log.info("job %s: fast preview in %.3fs%s", job_id, time.perf_counter() - t0,
             " (begun at the decode)" if pending is not None else "")


def final_preview(session: Session, storage: Storage, job_id: str,
                  srgb_bands: Sequence[tuple[int, np.ndarray]] | None, nice: int = 0,
                  premade: Sequence[tuple[int, np.ndarray]] = (), orientation: int = 1) -> None:
    """At finalize: the preview becomes a downscale of the final render's sRGB strips (``srgb_bands``; a job
    whose recipes render no sRGB keeps its fast preview, which is sRGB); computed ``nice`` lower (batch lane), or
    from the block sums the GPU workers made beside the strips (``premade``); tagged with the shot's EXIF
    ``orientation``."""
    t0 = time.perf_counter()
    BYTES_WRITTEN.inc(sum(session.scalars(select(Output.bytes).where(Output.job_id == job_id))))
    if srgb_bands is None:
        return
    bands = srgb_bands
    try:
        etag = at_low_priority(lambda: write_preview(storage, job_id, strips_preview(bands, premade=premade),
                                                     orientation), nice)
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
    fast_preview(session, storage, job_id, plan.frames[0], plan.render, nice=_lane_nice(job, batch_nice))
