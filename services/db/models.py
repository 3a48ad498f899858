"""SQLAlchemy 2 models: stations, batches, jobs, frames, shards, outputs. The database is the source of truth."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """A timestamp as an aware UTC datetime (SQLite hands them back naive; an aware one of another offset, as a
    hand-made cursor may hold, is converted: SQLite compares the stored text, so 01:06+01:00 must be 00:06)."""
    return value.astimezone(dt.UTC) if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, dt.datetime: DateTime(timezone=True)}


class ServiceFact(Base):
    """What the service records about itself: ``storage_id``, the marker of the storage its files are in
    (services/storage/identity.py)."""

    __tablename__ = "service_facts"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Station(Base):
    """A capture station: the owner of jobs, authenticated by a bearer token stored as a hash."""

    __tablename__ = "stations"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # "station" (sees its own jobs) or "admin" (sees and acts on every station's work).
    role: Mapped[str] = mapped_column(String(16), default="station", server_default="station")
    revoked_at: Mapped[dt.datetime | None] = mapped_column(default=None)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class Job(Base):
    __tablename__ = "jobs"
    # A station's list pages newest first by (created_at, id): without it each page sorted every job the station
    # ever sent (55 ms a page at 44,000 jobs, growing with the history; 0.3 ms with it).
    __table_args__ = (Index("ix_jobs_station_id_created_at", "station_id", "created_at", "id"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    station_id: Mapped[str] = mapped_column(ForeignKey("stations.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    camera: Mapped[str] = mapped_column(String(16))
    recipe: Mapped[str] = mapped_column(String(64))  # the first of ``recipes`` (older rows: the only one)
    # Every recipe the job asked for, in order (NULL on rows from before several recipes per job).
    recipes: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    priority: Mapped[str] = mapped_column(String(16), default="interactive")
    stage: Mapped[str] = mapped_column(String(32), default="queued")
    # Index into plan["phases"]; advanced with a conditional UPDATE so exactly one coordinator wins.
    phase: Mapped[int] = mapped_column(Integer, default=-1)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    # Shot-level parameters computed once at ingest (white balance, noise, colour) and the phase plan.
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    # The batch lane (a batch's shots, priority=batch) waits for admission; interactive jobs are admitted at once.
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id"), index=True, default=None)
    admitted_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    # When retention removed its uploads and outputs (services/jobs/retention.py); None while they are kept.
    pruned_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    # Bumped by every UPDATE of the row (ORM or Core): the dashboard's change feed reads it.
    updated_at: Mapped[dt.datetime | None] = mapped_column(default=utcnow, onupdate=utcnow, index=True)
    # The JPEG preview (storage key from services.storage.keys.preview_key): its ETag and "fast" | "final".
    preview_etag: Mapped[str | None] = mapped_column(String(64), default=None)
    preview_kind: Mapped[str | None] = mapped_column(String(16), default=None)
    # The outbox: when its ingest message was handed to the broker; None while an admitted job's message is not
    # sent yet (the broker was down), which the coordinator's outbox pass sends within seconds.
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(default=None, index=True)

    station: Mapped[Station] = relationship(lazy="joined")
    frames: Mapped[list[Frame]] = relationship(
        back_populates="job", order_by="Frame.index", cascade="all, delete-orphan"
    )
    shards: Mapped[list[Shard]] = relationship(
        back_populates="job", order_by="(Shard.phase, Shard.index)", cascade="all, delete-orphan"
    )
    outputs: Mapped[list[Output]] = relationship(
        back_populates="job", order_by="Output.name", cascade="all, delete-orphan"
    )


class IdempotencyKey(Base):
    """A client's ``Idempotency-Key`` on a POST: the request's fingerprint and what it created
    (services/idempotency.py). ``resource_id`` is None while the first request is still being handled."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("station_id", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    station_id: Mapped[str] = mapped_column(ForeignKey("stations.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    scope: Mapped[str] = mapped_column(String(100))  # which operation: "jobs", "batches", "batch:<id>"
    fingerprint: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str | None] = mapped_column(String(32), default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)


class Batch(Base):
    """A station's set of shots rendered together (overnight), optionally inside a time window."""

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_station_id_created_at", "station_id", "created_at", "id"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    station_id: Mapped[str] = mapped_column(ForeignKey("stations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True, default="open")
    recipes: Mapped[list[str]] = mapped_column(JSON, default=list)
    priority: Mapped[str] = mapped_column(String(16), default="batch")
    not_before: Mapped[dt.datetime | None] = mapped_column(default=None)
    not_after: Mapped[dt.datetime | None] = mapped_column(default=None)
    on_window_end: Mapped[str | None] = mapped_column(String(8), default=None)  # wait | skip; None = the setting
    webhook_url: Mapped[str | None] = mapped_column(String(2000), default=None)
    # False while its creator still uploads shots: the batch renders them as they come but does not end before
    # it is sealed (POST /v1/batches/{id}/seal), so a slow upload cannot end it half-way.
    sealed: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    webhook_secret: Mapped[str | None] = mapped_column(String(128), default=None)
    webhook_attempts: Mapped[int] = mapped_column(Integer, default=0)
    webhook_status: Mapped[str | None] = mapped_column(String(200), default=None)  # last HTTP status or error
    webhook_delivered_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(default=None)


def job_recipes(job: Job) -> list[str]:
    """The recipes a job asked for, in order (older rows: their one ``recipe``)."""
    return list(job.recipes) if job.recipes else [job.recipe]


class Frame(Base):
    __tablename__ = "frames"
    __table_args__ = (UniqueConstraint("job_id", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))  # the safe form used in storage keys and downloads
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    # The file name exactly as uploaded (any characters: shown as text, never used as a path).
    original_name: Mapped[str | None] = mapped_column(String(255), default=None)
    job: Mapped[Job] = relationship(back_populates="frames")


class Shard(Base):
    """One unit of GPU work: a strip of a frame or a group of frames. Idempotent by (job, phase, index)."""

    __tablename__ = "shards"
    __table_args__ = (UniqueConstraint("job_id", "phase", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    phase: Mapped[int] = mapped_column(Integer)
    index: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # "strip" | "frame_group"
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|running|done|failed|cancelled
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    gpu: Mapped[str | None] = mapped_column(String(32), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    seconds: Mapped[float | None] = mapped_column(Float, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    job: Mapped[Job] = relationship(back_populates="shards")


class Output(Base):
    __tablename__ = "outputs"
    __table_args__ = (UniqueConstraint("job_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    storage_key: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(100), default="image/tiff")
    recipe: Mapped[str | None] = mapped_column(String(64), default=None)  # NULL on rows from before 0002
    deleted_at: Mapped[dt.datetime | None] = mapped_column(default=None)  # pruned by retention: 410 Gone
    job: Mapped[Job] = relationship(back_populates="outputs")
