"""A job's plan, typed: its GPU phases, each shard's payload and what ingest recorded about the shot.

Serialised to JSON only at the database boundary (``jobs.params``, ``shards.payload``), in the same shape the
service has always stored, so rows written by an older coordinator still load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from typing import Any

from services.export.derive import ProofSpec, box_factor, fit_long_edge, proof_spec
from services.export.output import FileSpec, file_spec, written_by_worker
from services.export.recipes import Compression, Format, Recipe
from services.export.tiff import tiff_around
from services.pipeline.render import RenderParams
from services.pipeline.shards import (
    FrameGroupShard,
    PreEncode,
    ProofWork,
    ShardInput,
    StackStripShard,
    StripShard,
    WholeFile,
)
from services.raw.colour import output_space
from services.raw.meta import CaptureInfo, RawMeta
from services.storage.keys import proof_key, raw_key, shard_key, space_shard_key, worker_file_keys

Offsets = tuple[tuple[int, int], ...]


class ShardKind(StrEnum):
    STRIP = "strip"  # rows of the image
    FRAME_GROUP = "frame_group"  # some frames of a stack, merged onto the reference


@dataclass(frozen=True)
class Phase:
    """One GPU phase. Strips of a single frame read ``source``; strips of a stack fuse the frame-group
    accumulators of ``groups_phase``; frame groups of a 4-shot pixel-shift stack carry ``offsets``."""

    kind: ShardKind
    source: str | None = None
    normalized: bool = False
    noise_scale: float = 1.0
    groups_phase: int | None = None
    pixel_shift: bool = False
    offsets: Offsets | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind == ShardKind.FRAME_GROUP:
            return {"kind": self.kind.value,
                    "pixel_shift": None if self.offsets is None else [list(o) for o in self.offsets]}
        if self.groups_phase is not None:
            return {"kind": self.kind.value, "groups_phase": self.groups_phase, "pixel_shift": self.pixel_shift}
        return {"kind": self.kind.value, "source": self.source, "normalized": self.normalized,
                "noise_scale": self.noise_scale}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Phase:
        kind = ShardKind(d["kind"])
        if kind == ShardKind.FRAME_GROUP:
            raw = d.get("pixel_shift")
            offsets = None if raw is None else tuple((int(o[0]), int(o[1])) for o in raw)
            return cls(kind, pixel_shift=offsets is not None, offsets=offsets)
        groups = d.get("groups_phase")
        return cls(kind, source=d.get("source"), normalized=bool(d.get("normalized", False)),
                   noise_scale=float(d.get("noise_scale", 1.0)),
                   groups_phase=None if groups is None else int(groups), pixel_shift=bool(d.get("pixel_shift")))


@dataclass(frozen=True)
class ShardPayload:
    """What one shard works on: rows ``[y0, y1)`` (strips; ``groups`` accumulators to fuse for a stack) or
    ``frames`` (a frame group); ``gpu_slot`` pins it to the i-th live GPU worker (split ratio)."""

    gpu_slot: int | None = None
    y0: int = 0
    y1: int = 0
    groups: int | None = None
    frames: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.frames:
            return {"frames": list(self.frames), "gpu_slot": self.gpu_slot}
        d: dict[str, Any] = {"y0": self.y0, "y1": self.y1, "gpu_slot": self.gpu_slot}
        if self.groups is not None:
            d["groups"] = self.groups
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardPayload:
        slot = d.get("gpu_slot")
        groups = d.get("groups")
        return cls(gpu_slot=None if slot is None else int(slot), y0=int(d.get("y0", 0)), y1=int(d.get("y1", 0)),
                   groups=None if groups is None else int(groups), frames=tuple(int(i) for i in d.get("frames", ())))


# What ingest adds to a job's params (removed again when the job starts over).
PLANNED_KEYS = ("frames", "render", "plan", "n_workers", "ratios", "size", "gpu_memory_mb", "plan_version", "timings",
                "tile_spaces", "tile_level", "bin_specs", "proof_specs", "lean_spaces", "file_specs")
# The layout of a plan, its shard payloads and the intermediates they write (frame-group accumulators int32
# (5|6|9|11|15, H, W)). Rows without ``plan_version`` were planned by version 1 (4-channel accumulators); version 2 had
# no raw-sample merge (``RenderParams.raw_merge``, 11-channel accumulators); version 3 summed the Bayer channel of
# samples clipped at black (version 4 sums them unclipped: high-noise stacks' shadows were lifted and tinted);
# version 4 had no detail band (``RenderParams.detail_band``: (9|15, H, W) accumulators since version 5). A
# worker meeting a plan of another version raises IntermediateLost: the job starts over from its uploads with the
# new code instead of failing, and no job fuses groups of two versions (upgrades without a drain,
# docs/OPERATIONS.md).
PLAN_VERSION = 5


@dataclass(frozen=True)
class JobPlan:
    """What ingest decided once for the whole shot: every frame's metadata, the shared render parameters, the
    phases, and the GPU count and split ratios the shards were cut for."""

    frames: tuple[RawMeta, ...]
    render: RenderParams
    phases: tuple[Phase, ...]
    n_workers: int
    ratios: tuple[float, ...] | None
    size: tuple[int, int]  # (H, W) of the reference frame
    gpu_memory_mb: int = 0  # the smallest live GPU worker's memory budget at ingest (0: unknown, CPU workers)
    tile_spaces: tuple[str, ...] = ()  # spaces whose strips also get GPU-compressed TIFF tiles (:func:`tile_plan`)
    tile_level: int = 2  # nvCOMP's deflate algorithm type for them
    bin_specs: tuple[tuple[str, int], ...] = ()  # (space, factor): linear-light bins made on the GPU (:func:`bin_plan`)
    proof_specs: tuple[ProofSpec, ...] = ()  # resized outputs a whole-image strip finishes (:func:`proof_plan`)
    lean_spaces: tuple[str, ...] = ()  # spaces no output reads the full rows of (:func:`lean_plan`)
    file_specs: tuple[FileSpec, ...] = ()  # TIFFs a whole-image strip's worker writes itself (:func:`file_plan`)
    extra: Mapping[str, Any] = field(default_factory=dict)  # other keys of jobs.params, kept as they are
    version: int = PLAN_VERSION  # the layout version of the plan, its payloads and intermediates

    @property
    def height(self) -> int:
        return self.size[0]

    @property
    def capture(self) -> CaptureInfo:
        """What the outputs record of the capture (the reference frame's)."""
        first = self.frames[0]
        return first.capture or CaptureInfo(make=first.make, model=first.model)

    def to_params(self) -> dict[str, Any]:
        return {
            **self.extra,
            "frames": {str(i): m.to_dict() for i, m in enumerate(self.frames)},
            "render": self.render.to_dict(),
            "plan": [p.to_dict() for p in self.phases],
            "n_workers": self.n_workers,
            "ratios": None if self.ratios is None else list(self.ratios),
            "size": list(self.size),
            "gpu_memory_mb": self.gpu_memory_mb,
            "plan_version": self.version,
            **({"tile_spaces": list(self.tile_spaces), "tile_level": self.tile_level} if self.tile_spaces else {}),
            **({"bin_specs": [list(b) for b in self.bin_specs]} if self.bin_specs else {}),
            **({"proof_specs": [list(p) for p in self.proof_specs]} if self.proof_specs else {}),
            **({"lean_spaces": list(self.lean_spaces)} if self.lean_spaces else {}),
            **({"file_specs": [f.to_list() for f in self.file_specs]} if self.file_specs else {}),
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> JobPlan:
        """The plan stored in ``jobs.params`` (``KeyError`` when the job was never planned)."""
        frames = params["frames"]
        ratios = params.get("ratios")
        h, w = (int(v) for v in params["size"])
        return cls(
            frames=tuple(RawMeta.from_dict(frames[str(i)]) for i in range(len(frames))),
            render=RenderParams.from_dict(params["render"]),
            phases=tuple(Phase.from_dict(p) for p in params["plan"]),
            n_workers=int(params["n_workers"]),
            ratios=None if ratios is None else tuple(float(r) for r in ratios),
            size=(h, w),
            gpu_memory_mb=int(params.get("gpu_memory_mb", 0)),
            tile_spaces=tuple(params.get("tile_spaces") or ()),
            tile_level=int(params.get("tile_level", 2)),
            bin_specs=tuple((str(s), int(k)) for s, k in params.get("bin_specs") or ()),
            proof_specs=tuple((str(s), int(e), int(b), float(a)) for s, e, b, a in params.get("proof_specs") or ()),
            lean_spaces=tuple(params.get("lean_spaces") or ()),
            file_specs=tuple(FileSpec.from_list(f) for f in params.get("file_specs") or ()),
            extra={k: v for k, v in params.items() if k not in PLANNED_KEYS},
            version=int(params.get("plan_version", 1)),
        )


def tile_plan(recipes: Sequence[Recipe], gpu_deflate: bool) -> tuple[str, ...]:
    """The plan's ``tile_spaces``: output spaces whose strips also get their TIFF tiles compressed on the GPU
    (those a full-size 16-bit deflate TIFF is written from); none when switched off."""
    spaces = [r.colour_space for r in recipes if r.format == Format.TIFF and r.bits == 16 and r.long_edge is None
              and r.compression == Compression.DEFLATE]
    return tuple(dict.fromkeys(spaces)) if gpu_deflate else ()


def bin_plan(recipes: Sequence[Recipe], height: int, width: int, gpu_encode: bool) -> tuple[tuple[str, int], ...]:
    """The plan's ``bin_specs``: (space, factor) of every resized output's linear-light bins (the factor its
    resize bins by, :func:`services.export.derive.box_factor`), made on the GPU beside the strips."""
    specs = []
    for r in recipes:
        if r.long_edge is not None:
            h, w = fit_long_edge(height, width, r.long_edge)
            k = box_factor(height, width, h, w)
            if k > 1:
                specs.append((r.colour_space, k))
    return tuple(dict.fromkeys(specs)) if gpu_encode else ()


def proof_plan(recipes: Sequence[Recipe], bin_specs: Sequence[tuple[str, int]], height: int, width: int,
               worker_proofs: bool) -> tuple[ProofSpec, ...]:
    """The plan's ``proof_specs``: the resized outputs made from GPU bins (``bin_specs``) that the worker of a
    strip holding the whole image finishes on its device (:func:`services.pipeline.binning.proof_from_bins`);
    none when switched off (``STRATA_WORKER_PROOFS``)."""
    if not worker_proofs:
        return ()
    return tuple(dict.fromkeys(proof_spec(r) for r in recipes if r.long_edge is not None and served_without_rows(
        r, (), bin_specs, height, width)))


def file_plan(recipes: Sequence[Recipe], tile_spaces: Sequence[str], original: str, enabled: bool
              ) -> tuple[FileSpec, ...]:
    """The plan's ``file_specs``: for each space with GPU tiles and exactly one recipe a worker can write from
    them (a full-size 16-bit deflate TIFF), that file's spec; the worker of a strip holding the whole image then
    writes it itself (none when switched off: ``STRATA_WORKER_TIFFS``, batch-lane jobs, storage that cannot
    rename)."""
    if not enabled:
        return ()
    specs = []
    for space in tile_spaces:
        served = [r for r in recipes if r.colour_space == space and written_by_worker(r)]
        if len(served) == 1:
            specs.append(file_spec(served[0], original))
    return tuple(specs)


def lean_plan(recipes: Sequence[Recipe], tile_spaces: Sequence[str], bin_specs: Sequence[tuple[str, int]],
              height: int, width: int) -> tuple[str, ...]:
    """The plan's ``lean_spaces``: the colour spaces whose every recipe is made from what the GPU workers make
    beside the strips, a full-size 16-bit deflate TIFF from the tiles (``tile_spaces``) or a resized output from
    its bins (``bin_specs``); the final preview of sRGB comes from the block sums made with them. A worker that
    made them all for a strip of such a space keeps only the strip's rows that units (tile rows, bins, preview
    blocks) straddling its neighbours need (:func:`services.pipeline.shards.kept_rows`)."""
    return tuple(space for space in dict.fromkeys(r.colour_space for r in recipes)
                 if all(served_without_rows(r, tile_spaces, bin_specs, height, width)
                        for r in recipes if r.colour_space == space))


def served_without_rows(recipe: Recipe, tile_spaces: Sequence[str], bin_specs: Sequence[tuple[str, int]],
                        height: int, width: int) -> bool:
    """Whether ``recipe``'s file is made without its space's full rows: by GPU tiles or GPU bins."""
    if recipe.long_edge is None:
        return (recipe.colour_space in tile_spaces and recipe.format == Format.TIFF and recipe.bits == 16
                and recipe.compression == Compression.DEFLATE)
    h, w = fit_long_edge(height, width, recipe.long_edge)
    return (recipe.colour_space, box_factor(height, width, h, w)) in bin_specs


def proof_work(plan: JobPlan, keys: Mapping[str, str]) -> tuple[ProofWork, ...]:
    """The resized outputs (``plan.proof_specs``) a strip holding the whole image finishes from the bins of its
    result ``keys`` (by output space)."""
    height, width = plan.size
    work = []
    for space, long_edge, bits, amount in plan.proof_specs:
        if space in keys:
            h, w = fit_long_edge(height, width, long_edge)
            work.append(ProofWork(key=keys[space], k=box_factor(height, width, h, w),
                                  transfer=output_space(space).transfer, size=(h, w), sharpen=amount, bits=bits,
                                  out=proof_key(keys[space], long_edge, bits, amount)))
    return tuple(work)


def file_work(plan: JobPlan, keys: Mapping[str, str], hold: Callable[[], AbstractContextManager[object]] | None
              ) -> tuple[WholeFile, ...]:
    """The TIFFs (``plan.file_specs``) a strip holding the whole image writes from the tiles of its result
    ``keys`` (by output space)."""
    work = []
    for spec in plan.file_specs:
        if spec.space in keys and spec.space in plan.tile_spaces:
            out, record = worker_file_keys(keys[spec.space])
            work.append(WholeFile(key=keys[spec.space], out=out, record=record, hold=hold,
                                  around=partial(tiff_around, plan.height, plan.size[1], tags=spec.tags(plan.capture))))
    return tuple(work)


def is_planned(params: Mapping[str, Any]) -> bool:
    return "plan" in params


def phase_count(params: Mapping[str, Any]) -> int:
    """Phases in a stored plan (0 before ingest planned the job)."""
    return len(params.get("plan", []))


def shard_input(job_id: str, plan: JobPlan, phase: int, index: int, payload: ShardPayload,
                hold: Callable[[], AbstractContextManager[object]] | None = None) -> ShardInput:
    """What the pipeline needs to compute shard ``index`` of ``phase``: keys to read and write, parameters.
    ``hold``: held while its worker writes an output file itself (:class:`WholeFile`)."""
    spec = plan.phases[phase]
    out = shard_key(job_id, phase, spec.kind.value, index)
    if spec.kind == ShardKind.FRAME_GROUP:
        offsets = spec.offsets
        return FrameGroupShard(
            job_id=job_id, out=out, params=plan.render, stack_size=len(plan.frames), positions=payload.frames,
            reference=(raw_key(job_id, 0), plan.frames[0]),
            frames=tuple((raw_key(job_id, i), plan.frames[i]) for i in payload.frames),
            pixel_shift=None if offsets is None else tuple(offsets[i] for i in payload.frames),
        )
    r = plan.render
    params = replace(r, noise_shot=r.noise_shot * spec.noise_scale, noise_read=r.noise_read * spec.noise_scale)
    keys = strip_keys(job_id, plan.render, phase, spec.kind.value, index)
    extra = tuple(keys.values())[1:]
    whole = (payload.y0, payload.y1) == (0, plan.height)
    ahead = PreEncode(tiles=tuple(k for space, k in keys.items() if space in plan.tile_spaces), level=plan.tile_level,
                      bins=tuple((keys[space], k, output_space(space).transfer) for space, k in plan.bin_specs
                                 if space in keys),
                      lean=tuple(k for space, k in keys.items() if space in plan.lean_spaces),
                      proofs=proof_work(plan, keys) if whole else (),
                      files=file_work(plan, keys, hold) if whole else ())
    if spec.groups_phase is not None:
        groups = tuple(shard_key(job_id, spec.groups_phase, ShardKind.FRAME_GROUP.value, i)
                       for i in range(payload.groups or 0))
        return StackStripShard(job_id=job_id, out=out, params=params, y0=payload.y0, y1=payload.y1, groups=groups,
                               pixel_shift=spec.pixel_shift, space_outs=extra, ahead=ahead)
    assert spec.source is not None
    return StripShard(job_id=job_id, out=out, params=params, y0=payload.y0, y1=payload.y1, source=spec.source,
                      normalized=spec.normalized, space_outs=extra, ahead=ahead)


def strip_keys(job_id: str, render: RenderParams, phase: int, kind: str, index: int) -> dict[str, str]:
    """Where strip ``index`` of ``phase`` keeps its result in each output space the shot renders (primary first:
    the shard's own key, as a single-space job has always had it)."""
    keys = {render.space: shard_key(job_id, phase, kind, index)}
    for extra in render.extra_spaces:
        keys[extra.space] = space_shard_key(job_id, phase, kind, index, extra.space)
    return keys


def stack_phases(offsets: Sequence[tuple[int, int]] | None) -> tuple[Phase, ...]:
    """A stack: frame groups merged onto the reference, then strips that fuse their rows of every group's
    accumulator (no fused image on the coordinator)."""
    shift = None if offsets is None else tuple((int(a), int(b)) for a, b in offsets)
    return (Phase(ShardKind.FRAME_GROUP, pixel_shift=shift is not None, offsets=shift),
            Phase(ShardKind.STRIP, groups_phase=0, pixel_shift=shift is not None))


def single_frame_phases(job_id: str) -> tuple[Phase, ...]:
    """A single frame: strips of its decoded mosaic."""
    return (Phase(ShardKind.STRIP, source=raw_key(job_id, 0), normalized=False, noise_scale=1.0),)


def with_decoded_source(params: dict[str, object], meta: RawMeta) -> dict[str, object]:
    """``params`` with ``source_camera`` completed from the decoded reference frame where the upload's probe could
    not tell (non-TIFF formats: Make/Model from the decoder's capture tags, the layout LibRaw found)."""
    source = params.get("source_camera")
    if not isinstance(source, dict):
        return params
    capture = meta.capture
    filled = {"make": source.get("make") or meta.make or (capture.make if capture else ""),
              "model": source.get("model") or meta.model or (capture.model if capture else ""),
              "layout": source.get("layout") or meta.layout}
    return {**params, "source_camera": filled}
