"""Response schemas of the public v1 API."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from services.db.models import Job, as_utc


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
    status: str = Field(description="pending | running | done | failed")
    attempts: int
    seconds: float | None
    started_at: dt.datetime | None = Field(default=None, description="When its last attempt started (UTC).")
    finished_at: dt.datetime | None = Field(default=None, description="When it finished (UTC).")


class OutputOut(BaseModel):
    name: str
    url: str
    sha256: str
    bytes: int


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else as_utc(value)


class JobOut(BaseModel):
    id: str
    station: str = Field(description="Name of the station that submitted it.")
    status: str = Field(description="queued | running | done | failed | cancelled")
    camera: str
    recipe: str
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

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.id, station=job.station.name, status=job.status, camera=job.camera, recipe=job.recipe,
            priority=job.priority,
            progress=round(min(max(job.progress, 0.0), 1.0), 4), stage=job.stage,
            created_at=as_utc(job.created_at), started_at=_utc(job.started_at), finished_at=_utc(job.finished_at),
            frames=[FrameOut(name=f.name, original_name=f.original_name, sha256=f.sha256, bytes=f.bytes)
                    for f in job.frames],
            shards=[ShardOut(index=s.index, phase=s.phase, kind=s.kind, worker=s.worker, gpu=s.gpu, status=s.status,
                             attempts=s.attempts, seconds=s.seconds, started_at=_utc(s.started_at),
                             finished_at=_utc(s.finished_at)) for s in job.shards],
            outputs=[OutputOut(name=o.name, url=f"/v1/jobs/{job.id}/outputs/{o.name}", sha256=o.sha256,
                               bytes=o.bytes) for o in job.outputs],
            error=job.error, updated_at=_utc(job.updated_at),
            preview_url=f"/v1/jobs/{job.id}/preview" if job.preview_etag else None, preview_kind=job.preview_kind,
            batch=getattr(job, "batch_id", None),
        )


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
    workers: dict[str, int]
    queues: dict[str, int] = Field(default_factory=dict)


class JobChanges(BaseModel):
    jobs: list[JobOut] = Field(description="Jobs changed since the cursor (all matching jobs without one).")
    cursor: str = Field(description="Pass as ?since= on the next poll.")


class TokenOut(BaseModel):
    name: str
    role: str = Field(description="station | admin")
    created_at: str
    revoked: bool


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    admin: bool = False
    rotate: bool = Field(default=False, description="Give an existing principal a new token.")


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
    memory_mb: float
    last_heartbeat: dt.datetime | None


class WorkersOut(BaseModel):
    workers: list[WorkerOut]
    queues: dict[str, dict[str, int]] = Field(description="Messages waiting per queue and priority.")
