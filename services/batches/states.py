"""The states of a batch and what happens to shots a window missed."""

from __future__ import annotations

from enum import StrEnum


class BatchStatus(StrEnum):
    OPEN = "open"  # no window, or its window is open; shots waiting for admission
    SCHEDULED = "scheduled"  # its window opens later
    RUNNING = "running"  # a shot was admitted
    DONE = "done"  # every shot ended, at least one rendered
    FAILED = "failed"  # every shot ended, none rendered
    CANCELLED = "cancelled"


UNFINISHED: tuple[BatchStatus, ...] = (BatchStatus.OPEN, BatchStatus.SCHEDULED, BatchStatus.RUNNING)


class WindowMissed(StrEnum):
    WAIT = "wait"  # shots not started by not_after wait for the same clock times the next day
    SKIP = "skip"  # they are reported as not run


# A shot a window missed (``skip``) ends cancelled with this reason; the report calls it "not_run".
NOT_RUN_PREFIX = "not run:"
NOT_RUN = "not_run"
