"""Response schemas of the public v1 API."""

from __future__ import annotations

import datetime as dt
import math

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from services.db.models import Job, Output, as_utc, job_recipes
from services.raw.meta import snr_db


class FrameOut(BaseModel):
    name: str
    original_name: str | None = Field(default=None, description="The file name as uploaded (display only).")
    sha256: str
    bytes: int


class ShardOut(BaseModel):
    index: int
    phase: int
    kind: str = Field(description="strip | frame_group")
    worker: str | None
    gpu: str | None
    status: str = Field(description="pending | running | done | failed | cancelled (its job ended before it finished)")
    attempts: int
    seconds: float | None
    started_at: dt.datetime | None = Field(default=None, description="When its last attempt started (UTC).")
    finished_at: dt.datetime | None = Field(default=None, description="When it finished (UTC).")


class OutputOut(BaseModel):
    name: str
    recipe: str | None = Field(default=None, description="The recipe that made it (null on outputs from before).")
    media_type: str = "image/tiff"
    url: str
    sha256: str
    bytes: int


class RecipeOut(BaseModel):
    name: str
    format: str = Field(description="tiff | jpeg | png")
    bits: int
    space: str = Field(description="srgb | adobergb | prophoto | linear")
    compression: str = Field(description="TIFF: none | deflate | lzw | zstd")
    quality: int = Field(description="JPEG quality")
    long_edge: int | None = Field(description="Long edge in pixels; null = full size")
    sharpen: float = Field(description="Output sharpening of resized files")
    ppi: float
    naming: str = Field(description="The naming template in effect")
    extension: str
    media_type: str
    description: str
    model: str | None = Field(default=None, description="The model tier it asks for: best | fast | max; null: the "
                                                        "service's STRATA_MODEL_TIER")


class RecipeList(BaseModel):
    recipes: list[RecipeOut]


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else as_utc(value)


class SourceCameraOut(BaseModel):
    make: str = Field(description="The file's Make tag ('' when the format does not state it at upload).")
    model: str = Field(description="The file's Model tag.")
    layout: str = Field(description="bayer | linear | '' (not known before decode: non-TIFF formats)")


def _source_camera(job: Job) -> SourceCameraOut | None:
    source = (job.params or {}).get("source_camera")
    if not isinstance(source, dict):
        return None  # jobs recorded before the field existed
    return SourceCameraOut(make=str(source.get("make", "")), model=str(source.get("model", "")),
                           layout=str(source.get("layout", "")))


class RenderOut(BaseModel):
    """How the shot is rendered, decided once at ingest (null on the job until then)."""

    package: str = Field(description="The model package (a shipped package's file name, else its path).")
    orientations: int = Field(description="Renders averaged per frame: 1, 2 (`best` on a clean frame) or 4 (`max`).")
    frames: int = Field(description="Frames the image stands for (a stack's size; 1 for a single frame).")
    frames_package: str | None = Field(default=None, description="A stack's frames' model package; null otherwise.")
    noise_shot: float = Field(description="The noise model's shot coefficient (variance = shot * x + read).")
    noise_read: float = Field(description="The noise model's read variance.")
    snr_db: float | None = Field(description="Signal-to-noise ratio at 18 % grey in dB; null for a noise-free model.")

    @classmethod
    def of(cls, render: dict | None) -> RenderOut | None:
        if not render:
            return None
        shot, read = float(render.get("noise_shot", 0.0)), float(render.get("noise_read", 0.0))
        snr = snr_db(shot, read)
        return cls(package=str(render.get("model", "")), orientations=int(render.get("orientations", 1)),
                   frames=int(render.get("frames", 1)), frames_package=render.get("frames_model") or None,
                   noise_shot=shot, noise_read=read, snr_db=round(snr, 2) if math.isfinite(snr) else None)


class JobOut(BaseModel):
    id: str
    station: str = Field(description="Name of the station that submitted it.")
    status: str = Field(description="queued | running | done | failed | cancelled")
    camera: str = Field(description="The render profile: IQ3_S (a single frame in strips) or IQ2_XS (a stack).")
    source_camera: SourceCameraOut | None = Field(
        default=None, description="The camera the file names (frame 0's Make/Model) and its sensor layout.")
    recipe: str = Field(description="The first of `recipes`.")
    recipes: list[str]
    priority: str
    progress: float = Field(ge=0, le=1)
    stage: str
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    frames: list[FrameOut]
    shards: list[ShardOut]
    outputs: list[OutputOut]
    error: str | None
    updated_at: dt.datetime | None = Field(default=None, description="Last change of the job row (UTC).")
    preview_url: str | None = Field(default=None, description="The JPEG preview; null until there is one.")
    preview_kind: str | None = Field(default=None, description="fast (binned mosaic at ingest) | final (render)")
    batch: str | None = Field(default=None, description="The batch it belongs to, when batches exist.")
    files_removed_at: dt.datetime | None = Field(
        default=None, description="When its uploads and outputs were removed (retention, or DELETE .../files).")
    timings: dict[str, float] = Field(
        default_factory=dict,
        description="Seconds per stage: decode_s, prepare_s (decode + shared parameters + plan), shifts_s (a stack's "
                    "global shifts, part of prepare_s), phase_N_s (the "
                    "phase's first shard started -> its last finished), encode_s (every output written).")
    render: RenderOut | None = Field(default=None, description="How the shot is rendered; null until ingest "
                                     "has decided.")

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.id, station=job.station.name, status=job.status, camera=job.camera,
            source_camera=_source_camera(job), recipe=job.recipe,
            recipes=job_recipes(job),
            priority=job.priority,
            progress=round(min(max(job.progress, 0.0), 1.0), 4), stage=job.stage,
            created_at=as_utc(job.created_at), started_at=_utc(job.started_at), finished_at=_utc(job.finished_at),
            frames=[FrameOut(name=f.name, original_name=f.original_name, sha256=f.sha256, bytes=f.bytes)
                    for f in job.frames],
            shards=[ShardOut(index=s.index, phase=s.phase, kind=s.kind, worker=s.worker, gpu=s.gpu, status=s.status,
                             attempts=s.attempts, seconds=s.seconds, started_at=_utc(s.started_at),
                             finished_at=_utc(s.finished_at)) for s in job.shards],
            outputs=[OutputOut(name=o.name, recipe=o.recipe, media_type=o.media_type,
                               url=f"/v1/jobs/{job.id}/outputs/{o.name}", sha256=o.sha256, bytes=o.bytes)
                     for o in _in_recipe_order(job)],
            error=job.error, updated_at=_utc(job.updated_at),
            preview_url=f"/v1/jobs/{job.id}/preview" if job.preview_etag and not job.pruned_at else None,
            preview_kind=job.preview_kind, batch=job.batch_id, files_removed_at=_utc(job.pruned_at),
            timings=stage_timings(job), render=RenderOut.of(job.params.get("render")),
        )


def stage_timings(job: Job) -> dict[str, float]:
    """The job's stage timings: what ingest and finalize recorded, and each GPU phase's span from its shards."""
    out = {k: float(v) for k, v in job.params.get("timings", {}).items()}
    for phase in sorted({s.phase for s in job.shards}):
        mine = [s for s in job.shards if s.phase == phase and s.started_at and s.finished_at]
        if mine:
            span = max(as_utc(s.finished_at) for s in mine) - min(as_utc(s.started_at) for s in mine)  # type: ignore[arg-type]
            out[f"phase_{phase}_s"] = round(span.total_seconds(), 4)
    return out


def _in_recipe_order(job: Job) -> list[Output]:
    """A job's outputs in the order of its recipes (outputs of no listed recipe last, by name)."""
    order = {name: i for i, name in enumerate(job_recipes(job))}
    return sorted(job.outputs, key=lambda o: (order.get(o.recipe or "", len(order)), o.name))


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page.")


class ErrorOut(BaseModel):
    type: str
    detail: str


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str = Field(description="ready | not_ready")
    database: str
    redis: str
    storage: str = Field(default="ok", description="ok, or error: why the storage backend cannot be used now")
    workers: dict[str, int]
    queues: dict[str, int] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list, description="When not ready, why, one line each.")


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # {"not_befor": …} started a night's batch at once, window ignored

    name: str = Field(min_length=1, max_length=200)
    recipes: list[str] = Field(default_factory=list, description="Recipe names; default the default recipe.")
    priority: str | None = Field(default=None, description="batch (default) | interactive")
    not_before: str | None = Field(default=None, description="ISO 8601; without offset = studio time zone.")
    not_after: str | None = Field(default=None, description="ISO 8601; without offset = studio time zone.")
    on_window_end: str | None = Field(default=None, description="wait | skip; default STRATA_BATCH_WINDOW_MISSED.")
    paths: list[str] = Field(default_factory=list, description="Files or folders under STRATA_IMPORT_ROOT.")
    webhook_url: str | None = Field(default=None, description="http(s) URL told when the batch ends.")
    sealed: bool = Field(default=True, description=(
        "false: shots are still being uploaded; they render as they come, but the batch does not end before "
        "POST /v1/batches/{id}/seal (a slow upload cannot end it half-way)."))


class WebhookOut(BaseModel):
    attempts: int
    last_status: str | None
    delivered_at: dt.datetime | None


class BatchOut(BaseModel):
    id: str
    name: str
    status: str = Field(description="open | scheduled | running | done | failed | cancelled")
    recipes: list[str]
    priority: str
    not_before: dt.datetime | None
    not_after: dt.datetime | None
    on_window_end: str | None
    sealed: bool = Field(default=True, description="false: more shots are coming; it does not end before sealed.")
    counts: dict[str, int] = Field(description="Shots by status: queued, running, done, failed, cancelled, not_run.")
    total: int
    shots_per_minute: float | None
    eta: dt.datetime | None = Field(description="When the rest should be done at the pace so far; null if unknown.")
    webhook_url: str | None
    webhook: WebhookOut
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    webhook_secret: str | None = Field(default=None, description="Only in the answer to the creation.")


class BatchList(BaseModel):
    batches: list[BatchOut]
    next_cursor: str | None


class ShotOutputOut(BaseModel):
    name: str
    url: str
    sha256: str
    bytes: int


class ShotOut(BaseModel):
    job: str
    name: str
    status: str = Field(description="queued | running | done | failed | cancelled | not_run")
    outputs: list[ShotOutputOut]
    error: str | None
    queued_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    seconds: float | None


class BatchReport(BaseModel):
    batch: BatchOut
    shots: list[ShotOut]


class JobChanges(BaseModel):
    jobs: list[JobOut] = Field(description="Jobs changed since the cursor (all matching jobs without one).")
    cursor: str = Field(description="Pass as ?since= on the next poll.")


class TokenOut(BaseModel):
    name: str
    role: str = Field(description="station | admin")
    created_at: str
    revoked: bool


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # {"role": "admin"} made a station silently

    name: str = Field(min_length=1, max_length=200)
    admin: StrictBool = False
    rotate: StrictBool = Field(default=False, description="Give an existing principal a new token (same role).")


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token: shown once, stored hashed.")


class WorkerOut(BaseModel):
    name: str
    kind: str
    host: str
    gpu: str
    device: str
    busy: bool
    current_shard: int | None
    shards: list[int] = Field(default=[], description="Every shard a GPU worker holds now: those on the device "
                              "(STRATA_GPU_WORKER_THREADS slots) and those storing results or waiting for a slot "
                              "(STRATA_GPU_OVERLAP_THREADS); current_shard is the lowest.")
    jobs: list[str] = Field(default=[], description="Jobs a coordinator is ingesting or advancing now (its leases).")
    memory_mb: float
    last_heartbeat: dt.datetime | None


class WorkersOut(BaseModel):
    workers: list[WorkerOut]
    queues: dict[str, dict[str, int]] = Field(description="Messages waiting per queue and priority.")
