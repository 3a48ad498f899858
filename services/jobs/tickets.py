"""What the state machine hands to the queue adapter: work to dispatch after the commit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShardTicket:
    """What the queue needs to dispatch a shard: its id, the job's priority, an optional GPU slot."""

    shard_id: int
    priority: str
    slot: int | None
    job_id: str | None = None  # set by the reconciler (it sweeps the job's half-written files)


@dataclass(frozen=True)
class ShardOutcome:
    """A shard's run: whether its phase is now complete (then the job must advance)."""

    job_id: str
    priority: str
    phase_complete: bool
    kind: str = "strip"  # the shard's kind (strip | frame_group), a label of the shard-seconds metric


@dataclass
class Repairs:
    """Work the reconciler found lost (a message dropped, a worker gone) and re-dispatches."""

    ingest: list[tuple[str, str]]  # (job id, priority)
    shards: list[ShardTicket]
    advance: list[tuple[str, str]]
