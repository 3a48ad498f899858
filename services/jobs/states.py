"""The states a job and its shards move through (stored as their string values in the database)."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A job still in the machine: its steps may run; every step's conditional UPDATE is guarded by this.
ACTIVE: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.RUNNING)


class Stage(StrEnum):
    """What a job is doing now, for people watching it (``status`` is the state machine)."""

    QUEUED = "queued"
    DECODING = "decoding"
    ALIGNING = "aligning"
    ENHANCING = "enhancing"
    ENCODING = "encoding"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ShardStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its job ended (cancelled or failed) before it finished: never run, or result ignored


class BatchStatus(StrEnum):
    OPEN = "open"  # no window, or its window is open; shots waiting for admission
    SCHEDULED = "scheduled"  # its window opens later
    RUNNING = "running"  # a shot was admitted
    DONE = "done"  # every shot ended, at least one rendered
    FAILED = "failed"  # every shot ended, none rendered
    CANCELLED = "cancelled"


# A batch that may still take or render shots: its jobs' files are still referenced (retention keeps them).
BATCH_UNFINISHED: tuple[BatchStatus, ...] = (BatchStatus.OPEN, BatchStatus.SCHEDULED, BatchStatus.RUNNING)


class Priority(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


def in_batch_lane(priority: str, batch_id: str | None) -> bool:
    """Shots of a batch and ``priority=batch`` jobs: the batch lane, which waits for the coordinator's admission
    (docs/BATCHES.md) and whose CPU work runs at a lower priority."""
    return batch_id is not None or priority == Priority.BATCH


def parse_enum(kind: type[StrEnum], value: str, what: str) -> StrEnum:
    """``value`` as a member of ``kind``; ``BadInput`` naming the choices otherwise."""
    from services.errors import BadInput

    cleaned = value.strip().lower()
    try:
        return kind(cleaned)
    except ValueError:
        raise BadInput(f"unknown {what} {cleaned!r}; expected one of {', '.join(m.value for m in kind)}") from None

# A shard's payload key: when (epoch seconds) the retry message of its last failed attempt is due; until then the
# reconciler does not take the shard for lost (flow.note_retry).
RETRY_AT = "retry_at"
