"""What each GPU shard computes: typed inputs (storage keys and shared parameters) in, a stored array out.

Session-free and queue-free: the job state machine (``services.jobs``) decides which shard runs and records
that it ran; this module only reads its inputs from storage, computes on the worker's device and writes the
result atomically under the shard's key, the same bytes every time (a redelivered shard rewrites them).
Results are intermediates, not synced (docs/ARCHITECTURE.md, "Durability").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from services.errors import IntermediateLost
from services.pipeline import resident, tiles
from services.pipeline.binning import bin_rows_in, binned, binned_on, preview_sums, proof_from_bins
from services.pipeline.gate import device_slot, paused_seconds, urgent, yield_to_urgent
from services.pipeline.preview import preview_factor
from services.pipeline.render import OnDevice, RenderParams, render_strip_spaces
from services.pipeline.stack import (
    ACCUMULATOR_CHANNELS,
    Accumulator,
    accumulator_channels,
    merge_frame_group,
    merge_group_tensor,
    render_stack_strip_spaces,
)
from services.pipeline.tiles import TILE_H, tile_rows_in
from services.pipeline.transfer import download_each, download_to, prefault
from services.raw.meta import RawMeta
from services.storage.base import Storage
from services.storage.intermediates import load_intermediate
from services.storage.keys import bin_key, preview_sums_key, tile_keys

log = logging.getLogger(__name__)
StoredFrame = tuple[str, RawMeta]  # (storage key of the decoded mosaic, its metadata)


@dataclass(frozen=True)
class ProofWork:
    """A resized output the worker finishes from the bins (``key``'s, by ``k``) when its strip holds the whole
    image: filtered to ``size``, encoded with ``transfer``, sharpened, quantised to ``bits``; stored under ``out``
    (:func:`services.pipeline.binning.proof_from_bins`)."""

    key: str
    k: int
    transfer: str
    size: tuple[int, int]
    sharpen: float
    bits: int
    out: str


Around = Callable[[np.ndarray], tuple[bytes, list[bytes]]]  # a tile index -> the file's bytes before / after them


@dataclass(frozen=True)
class WholeFile:
    """A full-size TIFF the worker of a strip holding the whole image writes itself from the strip's tiles
    (``key``'s), durably, to ``out`` with its SHA-256 and size beside it (``record``): the finalize then only moves
    it into the job's outputs. ``around`` lays the file out around the tile streams
    (:func:`services.export.tiff.tiff_around`); ``hold`` is held while the file is written (an interactive
    shot's disk quiet window, :mod:`services.jobs.quiet`)."""

    key: str
    out: str
    record: str
    around: Around
    hold: Callable[[], AbstractContextManager[object]] | None = None


@dataclass(frozen=True)
class PreEncode:
    """Output work the worker does beside a strip, for the writer: the TIFF tiles of ``tiles`` (result keys: the
    spaces a full-size 16-bit deflate TIFF is written from) compressed with nvCOMP's deflate ``level``
    (:mod:`services.pipeline.tiles`), and the linear-light bins of ``bins`` ((result key, factor, transfer): the
    resized outputs, :mod:`services.pipeline.binning`). Tiles need a GPU with nvCOMP; what a worker does not make,
    the writer does."""

    tiles: tuple[str, ...] = ()
    level: int = 2
    bins: tuple[tuple[str, int, str], ...] = ()
    lean: tuple[str, ...] = ()  # result keys no output reads the full rows of once their tiles and bins are made
    proofs: tuple[ProofWork, ...] = ()  # asked of a strip holding the whole image only
    files: tuple[WholeFile, ...] = ()  # the same


@dataclass(frozen=True)
class StripShard:
    """Rows ``[y0, y1)`` of a single frame rendered from its decoded mosaic ``source``."""

    job_id: str
    out: str
    params: RenderParams
    y0: int
    y1: int
    source: str
    normalized: bool = False
    space_outs: tuple[str, ...] = ()  # where the result in each of ``params.extra_spaces`` goes, in order
    ahead: PreEncode = PreEncode()


@dataclass(frozen=True)
class StackStripShard:
    """Rows ``[y0, y1)`` of a stack, fused from every frame group's accumulator (``groups``) and rendered."""

    job_id: str
    out: str
    params: RenderParams
    y0: int
    y1: int
    groups: tuple[str, ...]
    pixel_shift: bool
    space_outs: tuple[str, ...] = ()  # as for StripShard
    ahead: PreEncode = PreEncode()


@dataclass(frozen=True)
class FrameGroupShard:
    """Some frames of a stack aligned to the shared reference and accumulated (int32 fixed point).

    ``positions``: each frame's index in the whole stack; ``pixel_shift``: each frame's whole-pixel offset in a
    4-shot pixel-shift stack (None: sub-pixel merge)."""

    job_id: str
    out: str
    params: RenderParams
    stack_size: int
    positions: tuple[int, ...]
    reference: StoredFrame
    frames: tuple[StoredFrame, ...]
    pixel_shift: tuple[tuple[int, int], ...] | None = None


ShardInput = StripShard | StackStripShard | FrameGroupShard


def compute_shard(storage: Storage, shard: ShardInput, device: str, gpu: str | None = None) -> str:
    """Compute one shard on ``device`` and store its result; returns the result's key. At debug level, logs what
    the device allocated for it (the seed engine's ``GPU0: allocated 2.1GB VRAM for stage ai_enhance``)."""
    on_gpu = device.startswith("cuda") and log.isEnabledFor(logging.DEBUG)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    key = _compute(storage, shard, device)
    if on_gpu:
        stage = {FrameGroupShard: "align_merge", StackStripShard: "fuse_enhance"}.get(type(shard), "enhance")
        log.debug("GPU%s: allocated %.1fGB VRAM for stage %s (%s)", gpu if gpu is not None else device,
                  torch.cuda.max_memory_allocated(device) / 1e9, stage, shard.out)
    return key


def _compute(storage: Storage, shard: ShardInput, device: str) -> str:
    if isinstance(shard, FrameGroupShard):
        _merge_group(storage, shard, device)
        return shard.out
    if isinstance(shard, StackStripShard):
        kept = [resident.take(device, shard.job_id, key) if resident.enabled(device) else None
                for key in shard.groups]
        groups: list[Accumulator] = [g if g is not None else load_accumulator(storage, shard.job_id, key)
                                     for g, key in zip(kept, shard.groups, strict=True)]
        _write_rows(storage, shard, groups[0].shape[2], groups[0].shape[1], _stack_render(groups, shard, device),
                    device)
        return shard.out
    source = load_intermediate(storage, shard.job_id, shard.source)

    def render(y0: int, y1: int, into: list[np.ndarray], ready: Callable[[], object] | None,
               on_device: OnDevice | None = None) -> None:
        render_strip_spaces(source, y0, y1, shard.params, device=device, normalized=shard.normalized, into=into,
                            ready=ready, on_device=on_device)
    _write_rows(storage, shard, source.shape[1], source.shape[0], render, device)
    return shard.out


def _stack_render(groups: Sequence[Accumulator], shard: StackStripShard, device: str) -> Render:
    def render(y0: int, y1: int, into: list[np.ndarray], ready: Callable[[], object] | None,
               on_device: OnDevice | None = None) -> None:
        render_stack_strip_spaces(groups, y0, y1, shard.params, device=device, pixel_shift=shard.pixel_shift,
                                  into=into, ready=ready, on_device=on_device)
    return render


Render = Callable[..., None]  # (y0, y1, into, ready, on_device=None): a strip's rows into ``into``


def kept_rows(y0: int, y1: int, height: int, units: Sequence[int], tiled: bool) -> list[tuple[int, int]]:
    """The rows ``[a, b)`` (from ``y0``) of a lean strip ``[y0, y1)`` that the writer may still read: those of the
    units (TIFF tile rows when ``tiled``, bins and preview blocks of ``units`` rows each) that straddle the strip's
    neighbours, which the writer makes from both strips' rows. The rest it takes from the tiles, bins and sums made
    beside the strip; the image's last rows that make no whole bin are read by nothing. All of them when the strip
    holds no whole unit of some kind."""
    held = [(TILE_H, tile_rows_in(y0, y1, height))] if tiled else []
    held += [(k, bin_rows_in(y0, y1, k)) for k in units]
    head, tail = 0, y1 - y0
    for size, inside in held:
        if not len(inside):
            return [(0, y1 - y0)]
        head = max(head, inside.start * size - y0)
        if y1 < height:
            tail = min(tail, inside.stop * size - y0)
    if head >= tail:
        return [(0, y1 - y0)]
    return [(a, b) for a, b in ((0, head), (tail, y1 - y0)) if b > a]


def _write_rows(storage: Storage, shard: StripShard | StackStripShard, width: int, height: int, render: Render,
                device: str) -> None:
    """Render the strip straight into the memory-mapped ``.npy`` files it publishes (one per output space): the
    device downloads its rows through the pinned slots into the maps, whose pages are touched on threads while
    the device computes (``prefault``), so no second copy of the rows is made on the host. The extra spaces are
    published first: the primary result's key is the one a reader checks for the whole shard. So is the output work
    ``shard.ahead`` asks of the worker (:class:`PreEncode`): proof bins and TIFF tiles are made from the rows while
    they are still on the device. Logs how long the render (with the rows' download), the bins and the tiles took."""
    keys = [shard.out, *shard.space_outs]
    if len(keys) != len(shard.params.spaces):
        raise ValueError(f"{len(shard.params.spaces)} output spaces for {len(keys)} result keys")
    shape = (shard.y1 - shard.y0, width, 3)
    ahead = shard.ahead
    tile_spaces = {i for i, key in enumerate(keys) if key in ahead.tiles} if ahead.tiles and tiles.gpu_available(
        device) else set()
    made = _Made()
    srgb = shard.params.spaces.index("srgb") if "srgb" in shard.params.spaces and (ahead.tiles or ahead.bins) else -1

    lean = _lean_spaces(shard, keys, tile_spaces, srgb, height, width)

    def on_device(space: int, rows: torch.Tensor) -> list[tuple[int, int]] | None:  # the writer's work, on device
        if rows.shape[0] != shape[0]:  # (an out-of-memory split: the host path in _pre_encode)
            return None
        yield_to_urgent()  # a batch strip lets an interactive one have the device before its bins and tiles
        t = time.perf_counter()
        for key, k, transfer in ahead.bins:
            if key == keys[space]:
                _bins_on_device(made, ahead, binned_on(rows, shard.y0, k, transfer, device), key, k)
        if space == srgb:  # the final preview's block sums (the coordinator then skips reading the render)
            factor = preview_factor(height, width)
            made.preview = (preview_sums_key(keys[space], factor), preview_sums(rows, shard.y0, factor, device))
        if space in tile_spaces:
            t += yield_to_urgent()  # (the pause is not the tiles' time)
            streams = _device_tiles(keys[space], rows, shard.y0, height, device, ahead.level)
            if streams is not None:
                made.tiles[keys[space]] = streams
        made.seconds += time.perf_counter() - t
        if space in lean and made.covers(keys[space], ahead, space == srgb):
            made.lean.append(keys[space])
            return lean[space]  # a lean strip: only the rows its neighbours' straddling units need
        return None

    t0 = time.perf_counter()
    with ExitStack() as stack:  # entered primary first, so it is published (exited) last
        outs = [stack.enter_context(storage.array_writer(
            key, shape, np.uint16, durable=False, written=partial(_written_rows, made, key, lean.get(i))))
            for i, key in enumerate(keys)]
        waits = [prefault(out[a:b]) for i, out in enumerate(outs) for a, b in lean.get(i, [(0, shape[0])])]
        asked = time.perf_counter()
        paused_seconds()  # (reset: the log line counts this strip's pauses)
        with device_slot():  # released before the results are stored: the next strip renders meanwhile
            waited = time.perf_counter() - asked  # for a device slot (the other strips on this worker's device)
            split_on_oom(render, shard.y0, shard.y1, outs, lambda: [wait() for wait in waits],
                         on_device if tile_spaces or ahead.bins else None)
        t1 = time.perf_counter()
        _pre_encode(storage, ahead, dict(zip(keys, outs, strict=True)), shard.y0, height, device, made)
    _log_strip(shard.out, len(keys), made, t1 - t0, waited, time.perf_counter() - t1)


def _log_strip(out: str, spaces: int, made: _Made, rendered: float, waited: float, stored: float) -> None:
    log.info("strip %s%s: rendered and downloaded in %.2fs (of which waiting for a device slot %.2fs, bins and tiles "
             "on the device %.2fs, paused for interactive shards %.2fs), bins and tiles stored in %.2fs%s", out,
             " (interactive)" if urgent.get() else "", rendered, waited, made.seconds, paused_seconds(), stored,
             f"; lean: {len(made.lean)} of {spaces} spaces' rows not downloaded" if made.lean else "")


def _bins_on_device(made: _Made, ahead: PreEncode, bins: torch.Tensor, key: str, k: int) -> None:
    """Keep ``key``'s bins by ``k`` for the writer, or, where the worker finishes every resized output made from
    them (:class:`ProofWork`), the finished outputs instead (then the bins are neither downloaded nor stored)."""
    proofs = [p for p in ahead.proofs if p.key == key and p.k == k]
    for p in proofs:
        made.proofs[p.out] = proof_from_bins(bins, p.size, p.transfer, p.sharpen, p.bits)
    made.bins[(key, k)] = None if proofs else bins.cpu().numpy()


def _written_rows(made: _Made, key: str, kept: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
    """The rows of ``key``'s strip that hold values: those kept where the strip went lean, else all (None)."""
    return kept if key in made.lean else None


def _lean_spaces(shard: StripShard | StackStripShard, keys: list[str], tile_spaces: set[int], srgb: int,
                 height: int, width: int) -> dict[int, list[tuple[int, int]]]:
    """The output spaces (by index) whose strip may be lean on this worker, with the rows it keeps
    (:func:`kept_rows` of its tile rows, bins and preview blocks): those the plan made lean whose tiles, if asked
    for, this worker makes, and that hold some whole unit."""
    out = {}
    for i, key in enumerate(keys):
        if key not in shard.ahead.lean or (key in shard.ahead.tiles and i not in tile_spaces):
            continue
        units = [k for b, k, _ in shard.ahead.bins if b == key] + ([preview_factor(height, width)] if i == srgb else [])
        rows = kept_rows(shard.y0, shard.y1, height, units, i in tile_spaces)
        if rows != [(0, shard.y1 - shard.y0)]:
            out[i] = rows
    return out


@dataclass
class _Made:
    """What a strip's ``on_device`` hook made from its rows before their download: proof bins by (result key,
    factor), TIFF tile streams (left on the device) by result key; and the seconds it took."""

    bins: dict[tuple[str, int], np.ndarray | None] = field(default_factory=dict)  # None: served by ``proofs``
    proofs: dict[str, np.ndarray] = field(default_factory=dict)  # finished resized outputs by storage key
    tiles: dict[str, tuple[torch.Tensor, np.ndarray]] = field(default_factory=dict)
    preview: tuple[str, np.ndarray] | None = None  # (key, the final preview's block sums)
    seconds: float = 0.0
    lean: list[str] = field(default_factory=list)  # result keys whose full rows were not downloaded

    def covers(self, key: str, ahead: PreEncode, srgb: bool) -> bool:
        """Whether everything ``ahead`` asks of ``key``'s rows was made (then the writer needs none but the
        straddling ones)."""
        return ((key not in ahead.tiles or key in self.tiles)
                and all((key, k) in self.bins for b, k, _ in ahead.bins if b == key)
                and (not srgb or self.preview is not None))


def _pre_encode(storage: Storage, ahead: PreEncode, results: dict[str, np.ndarray], y0: int, height: int,
                device: str, made: _Made | None = None) -> None:
    """The writer's work this worker does for the strip's results: proof bins (on any device: the same code the
    writer would run), then TIFF tiles (a GPU with nvCOMP only): those made while the rows were on the device
    (``made``), else from the downloaded rows."""
    made = made or _Made()
    if made.preview is not None:
        with storage.array_writer(made.preview[0], made.preview[1].shape, np.float32, durable=False) as out:
            out[:] = made.preview[1]
    for out_key, codes in made.proofs.items():
        with storage.array_writer(out_key, codes.shape, codes.dtype, durable=False) as out:
            out[:] = codes
    for key, k, transfer in ahead.bins:
        if key in results:
            if (key, k) in made.bins and made.bins[(key, k)] is None:  # its outputs were finished instead
                continue
            rows = made.bins.get((key, k))
            if rows is None:
                rows = binned(results[key], y0, k, transfer, device)
            with storage.array_writer(bin_key(key, k), rows.shape, np.float32, durable=False) as out:
                out[:] = rows
    if ahead.tiles and tiles.gpu_available(device):
        for key in ahead.tiles:
            streams = made.tiles.get(key)
            if streams is None and key in results:
                streams = _device_tiles(key, results[key], y0, height, device, ahead.level)
            whole = next((w for w in ahead.files if w.key == key), None)
            if streams is not None and not (whole is not None and _write_whole(storage, whole, height, *streams)):
                _write_tiles(storage, key, *streams)


def _device_tiles(key: str, rows: np.ndarray | torch.Tensor, y0: int, height: int, device: str, level: int
                  ) -> tuple[torch.Tensor, np.ndarray] | None:
    """The strip's TIFF tile streams compressed on the GPU (left there), or None: an nvCOMP or driver error
    costs only the speed, the writer compresses what has no tiles."""
    try:
        return tiles.device_tile_streams(rows, y0, height, device, level)
    except Exception:  # noqa: BLE001 - see above
        log.exception("GPU tile compression failed for %s; the TIFF writer compresses them", key)
        return None


def _write_tiles(storage: Storage, key: str, blob: torch.Tensor, index: np.ndarray) -> None:
    """The strip's tile streams beside its result, written as a stream from the pinned slots (a fresh memory
    map's page faults cost about as much as the compression); the index published last."""
    blob_key, index_key = tile_keys(key)
    with storage.array_stream(blob_key, tuple(blob.shape), np.uint8) as f:
        download_to(blob, f)
    with storage.array_writer(index_key, index.shape, np.int64, durable=False) as out:
        out[:] = index


def _write_whole(storage: Storage, whole: WholeFile, height: int, blob: torch.Tensor, index: np.ndarray) -> bool:
    """Write ``whole``'s TIFF: the bytes before the tiles, the tile streams from the device through the pinned
    slots (written and hashed each on a thread, :func:`download_each`), the bytes after them; durably (the
    finalize moves it into the outputs as it is), then its record. False, with nothing written, when the tiles do
    not cover the image (the finalize writes the file from the stored tiles then)."""
    try:
        head, tail = whole.around(index)
    except Exception as exc:  # noqa: BLE001 - the layout failing costs only the speed: the tiles are stored
        log.warning("%s: not written by the worker (%s: %s)", whole.out, type(exc).__name__, exc)
        return False
    t0 = time.perf_counter()
    digest = hashlib.sha256(head)
    with whole.hold() if whole.hold is not None else nullcontext(), storage.writer(whole.out) as f:
        f.write(head)
        download_each(blob, [f.write, digest.update])  # the write and the hash each on a thread (both release the GIL)
        for part in tail:
            f.write(part)
            digest.update(part)
        t_written = time.perf_counter()
    size = len(head) + int(blob.numel()) + sum(len(t) for t in tail)
    with storage.writer(whole.record, durable=False) as rec:
        rec.write(json.dumps({"sha256": digest.hexdigest(), "bytes": size}).encode())
    log.info("%s: %.1f MB written from the device's tiles in %.2fs, durable %.2fs later", whole.out, size / 1e6,
             t_written - t0, time.perf_counter() - t_written)
    return True


def load_accumulator(storage: Storage, job_id: str, key: str) -> np.ndarray:
    """A frame group's accumulator; one of a layout this code does not know (e.g. the 4-channel accumulators of
    an older version, written before an upgrade) is as good as lost: :class:`IntermediateLost`, so the job starts
    over and re-renders with this code rather than failing its strips. The layout is read from the ``.npy``
    header (shape and dtype). A file still being stored by a worker's thread is waited for
    (:func:`services.pipeline.resident.await_stored`)."""
    resident.await_stored(storage, job_id, key)
    acc = load_intermediate(storage, job_id, key)
    if acc.ndim != 3 or acc.shape[0] not in ACCUMULATOR_CHANNELS or acc.dtype != np.int32:
        raise IntermediateLost(job_id, key, f"accumulator of an unknown layout {acc.dtype}{tuple(acc.shape)}, "
                                            f"expected int32 ({'|'.join(map(str, ACCUMULATOR_CHANNELS))}, H, W)")
    return acc


def split_on_oom(render: Render, y0: int, y1: int, into: list[np.ndarray],
                 ready: Callable[[], object] | None = None, on_device: OnDevice | None = None) -> None:
    """``render(y0, y1, into, ready, on_device)`` (rows into one array per output space); when the device runs
    out of memory, the rows are rendered in two halves (cut on an even row) into the two halves of ``into``
    (without ``on_device``): strips are exact, so the result is the same bits, only later than planned."""
    try:
        render(y0, y1, into, ready, on_device)
    except torch.cuda.OutOfMemoryError:
        if y1 - y0 < 4:
            raise
        torch.cuda.empty_cache()
        mid = y0 + (y1 - y0) // 4 * 2
        log.warning("out of device memory rendering rows [%d, %d): rendering [%d, %d) and [%d, %d)", y0, y1, y0, mid,
                    mid, y1)
        split_on_oom(render, y0, mid, [a[: mid - y0] for a in into], ready)
        split_on_oom(render, mid, y1, [a[mid - y0 :] for a in into], None)


def _merge_group(storage: Storage, shard: FrameGroupShard, device: str) -> None:
    """The accumulator goes from the GPU straight into the file's pages (a memory map), whose pages are touched on
    threads while the GPU merges (``prefault``: allocating them on the host is otherwise on the critical path); on a
    GPU it also stays there for the strip that fuses it next (:mod:`services.pipeline.resident`), and is then
    stored on a thread after the task (``STRATA_GROUP_STORE=background``; frames of even size)."""
    frames = [(load_intermediate(storage, shard.job_id, key), meta) for key, meta in shard.frames]
    ref_key, ref_meta = shard.reference
    reference = (load_intermediate(storage, shard.job_id, ref_key), ref_meta)
    channels = accumulator_channels(shard.params, pixel_shift=bool(shard.pixel_shift))
    if resident.store_in_background(device) and reference[0].shape[0] % 2 == 0 and reference[0].shape[1] % 2 == 0:
        with device_slot():
            acc = merge_group_tensor(reference, frames, device=device, stack_size=shard.stack_size,
                                     positions=shard.positions, params=shard.params,
                                     pixel_shift=list(shard.pixel_shift) if shard.pixel_shift else None)
        resident.keep(device, shard.job_id, shard.out, acc)
        resident.store_later(storage, shard.job_id, shard.out, acc)  # after the task: the strip starts at once
        return
    held: list[torch.Tensor] = []  # the result on the device, kept once the stored file is published
    with storage.array_writer(shard.out, (channels, *reference[0].shape), np.int32, durable=False) as out, \
            device_slot():
        merge_frame_group(reference, frames, device=device, stack_size=shard.stack_size, positions=shard.positions,
                          params=shard.params, pixel_shift=list(shard.pixel_shift) if shard.pixel_shift else None,
                          out=out, out_ready=prefault(out), keep=held.append if resident.enabled(device) else None)
    if held:
        resident.keep(device, shard.job_id, shard.out, held[0])
