"""Shot preparation (the coordinator's ingest work): decode every frame, then decide once what every shard of
the shot shares: white balance, noise, colour and model package, and for a 4-frame stack whether it is a
pixel-shift pattern. Session-free: the job state machine records the result."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from services.errors import BadRawFile, FramesMismatch, RawDecodeError, UnsupportedSensor
from services.pipeline.preview import MosaicBinner
from services.pipeline.render import RenderParams
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import frame_shifts, pixel_shift_offsets, stack_params
from services.raw.decode import decode_raw
from services.raw.meta import CaptureInfo, RawMeta
from services.storage.base import Storage
from services.storage.keys import raw_key


@dataclass(frozen=True)
class DecodeLimits:
    """The decoder sandbox's limits and how many frames it decodes at once (0: one per frame up to the cores)."""

    timeout_s: float = 300.0
    memory_mb: int = 8192
    workers: int = 0
    fast_dng: bool = True  # uncompressed Bayer DNGs read straight from the file (services.raw.fast_dng)


@dataclass(frozen=True)
class PreparedShot:
    frames: tuple[RawMeta, ...]
    render: RenderParams
    pixel_shift: tuple[tuple[int, int], ...] | None  # whole-pixel offsets of a 4-shot pixel-shift stack
    decode_s: float
    preview_bins: MosaicBinner | None = None  # frame 0's bin sums, made during its decode (fast DNG path)
    shifts_s: float = 0.0  # a stack's global shifts (stack.frame_shifts)


def decode_frames(storage: Storage, job_id: str, uploads: Sequence[str], limits: DecodeLimits,
                  binner: MosaicBinner | None = None) -> list[RawMeta]:
    """Decode every upload (storage keys, in frame order) in a sandboxed child process, several at once, into
    the job's raw keys (an uncompressed DNG's copy on threads of its own: up to 8 shared by the frames); frame 0
    feeds ``binner`` where the fast path reads it. Raises ``RawError`` when one cannot be decoded, ``BadRawFile``
    when one decodes blank (:func:`check_not_blank`, on the frame's thread as the others decode)."""
    copy_threads = max(1, min(8, os.cpu_count() or 1) // len(uploads))

    def decode_one(index: int) -> RawMeta:
        try:
            source = storage.local_path(uploads[index])
        except FileNotFoundError as exc:
            raise RawDecodeError(f"the upload {uploads[index]} is missing from storage (removed or lost)") from exc
        with storage.path_writer(raw_key(job_id, index)) as tmp:
            meta = decode_raw(source, tmp, timeout_s=limits.timeout_s,
                              memory_mb=limits.memory_mb, fast_dng=limits.fast_dng, threads=copy_threads,
                              binner=binner if index == 0 else None)
        check_not_blank(storage.load_array(raw_key(job_id, index)), index, len(uploads))  # beside the others' decodes
        return meta

    workers = max(1, min(len(uploads), limits.workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="decode") as pool:
        return list(pool.map(decode_one, range(len(uploads))))


EXPOSURE_TOLERANCE_STOPS = 1 / 3  # a stack's frames may differ by a third of a stop (cameras round their settings)


def _stops(c: CaptureInfo | None) -> dict[str, float]:
    """log2 of each exposure factor the frame states: time, ISO and the aperture's 1 / N^2."""
    if c is None:
        return {}
    found = {"time": c.exposure_time, "iso": None if c.iso is None else float(c.iso), "aperture": c.f_number}
    out = {k: math.log2(v) for k, v in found.items() if v is not None and math.isfinite(v) and v > 0}
    if "aperture" in out:
        out["aperture"] *= -2.0
    return out


def exposure_difference(ref: CaptureInfo | None, other: CaptureInfo | None) -> float:
    """Stops by which ``other`` was exposed more than ``ref``, counting the factors both files state (0 when
    they state none in common)."""
    a, b = _stops(ref), _stops(other)
    return sum(b[k] - a[k] for k in a.keys() & b.keys())


def describe_exposure(c: CaptureInfo | None) -> str:
    """``1/125 s f/8 ISO 100`` from what the file states."""
    if c is None:
        return "no exposure recorded"
    parts = []
    if c.exposure_time is not None and c.exposure_time > 0:
        t = c.exposure_time
        parts.append(f"1/{round(1 / t)} s" if t < 0.5 else f"{t:g} s")
    if c.f_number:
        parts.append(f"f/{c.f_number:g}")
    if c.iso:
        parts.append(f"ISO {c.iso}")
    return " ".join(parts) or "no exposure recorded"


def check_frames_match(metas: Sequence[RawMeta]) -> None:
    """Every frame of a stack has frame 0's size, CFA pattern and exposure (as the files state it, within
    :data:`EXPOSURE_TOLERANCE_STOPS`); :class:`FramesMismatch` otherwise. A linear
    frame renders alone (:class:`UnsupportedSensor` in a stack; the API refuses such uploads already)."""
    ref = metas[0]
    if len(metas) > 1 and any(m.is_linear for m in metas):
        raise UnsupportedSensor("a stack of linear DNGs is not supported: a linear DNG renders as a single frame")
    for i, m in enumerate(metas[1:], start=1):
        if (m.width, m.height, m.cfa) != (ref.width, ref.height, ref.cfa):
            raise FramesMismatch(f"frame {i} ({m.width}x{m.height} {m.cfa}) does not match frame 0 "
                                 f"({ref.width}x{ref.height} {ref.cfa})")
        stops = exposure_difference(ref.capture, m.capture)
        if abs(stops) > EXPOSURE_TOLERANCE_STOPS:
            raise FramesMismatch(f"frame {i} was exposed {stops:+.1f} stops from frame 0 "
                                 f"({describe_exposure(m.capture)} against {describe_exposure(ref.capture)}): "
                                 f"a stack's frames must share one "
                                 f"exposure (exposure brackets are not merged; render them as single frames)")


BLANK_CHECK_HEAD = 1 << 16  # pixels read first by check_not_blank: where they differ, the frame is not blank


def check_not_blank(raw: np.ndarray, index: int, frames: int) -> None:
    """A decoded frame whose every pixel has one value holds no image: its data could not be read as the file
    describes it (found from outside: a DNG whose Compression tag said lossless JPEG over plain data rendered black
    and was reported done). Every pixel is looked at (a sample of rows refused a night scene lit in a few rows)."""
    sample = np.asarray(raw)
    if not sample.size:
        return
    flat = sample.reshape(-1)
    if (flat[:BLANK_CHECK_HEAD] != flat[0]).any():  # a picture's first rows vary (its noise alone): no full pass
        return
    if sample.min() == sample.max():
        which = f"frame {index}: " if frames > 1 else ""
        raise BadRawFile(f"{which}the decoded image is blank (every pixel {sample.flat[0]}): no picture to render "
                         f"(is the file's data what its tags say: compression, bits per sample?)")


def prepare_shot(storage: Storage, job_id: str, uploads: Sequence[str], *, camera: str, colour_space: str,
                 stack: bool, limits: DecodeLimits, extra_spaces: Sequence[str] = (),
                 model_tier: str | None = None) -> PreparedShot:
    """Decode the shot and compute its shared parameters once, on the reference frame (frame 0), for the
    primary ``colour_space`` and any ``extra_spaces`` the job's recipes need, with the model package of
    ``model_tier`` (best | fast | max; None: the setting)."""
    t0 = time.perf_counter()
    binner = MosaicBinner()
    metas = decode_frames(storage, job_id, uploads, limits, binner)
    check_frames_match(metas)
    decode_s = time.perf_counter() - t0
    ref = storage.load_array(raw_key(job_id, 0))
    shifts = None
    t1 = time.perf_counter()
    if len(metas) > 1:  # the frames' global shifts: the frames' package (stack_params) and pixel shift (below)
        frames = [(storage.load_array(raw_key(job_id, i)), m) for i, m in enumerate(metas)]
        shifts = frame_shifts(frames[0], frames)
    shifts_s = time.perf_counter() - t1
    try:
        params = replace(shot_render_params(metas[0], ref, colour_space, camera=camera,
                                            extra_spaces=extra_spaces, tier=model_tier), frames=len(metas))
        if shifts is not None:  # one orientation, the frames' package (stack.stack_params)
            params = stack_params(params, len(metas), shifts)
    except ValueError as exc:  # the file's levels or colour tags are unusable (white under black, zero gains ...)
        raise BadRawFile(f"implausible RAW metadata: {exc}") from exc
    offsets = None
    if stack and shifts is not None and len(metas) == 4:  # a 4-shot one-pixel pattern: no demosaic (pixel shift)
        found = pixel_shift_offsets(shifts)
        offsets = None if found is None else tuple((int(a), int(b)) for a, b in found)
    return PreparedShot(tuple(metas), params, offsets, decode_s, binner if binner.ready else None, shifts_s)
