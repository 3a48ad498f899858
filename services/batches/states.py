"""The states of a batch and what happens to shots a window missed."""

from __future__ import annotations

from enum import StrEnum

from services.jobs.states import BATCH_UNFINISHED, BatchStatus

UNFINISHED = BATCH_UNFINISHED  # the states live with the job states (services/jobs/states.py)


class WindowMissed(StrEnum):
    WAIT = "wait"  # shots not started by not_after wait for the same clock times the next day
    SKIP = "skip"  # they are reported as not run


# A shot a window missed (``skip``) ends cancelled with this reason; the report calls it "not_run".
NOT_RUN_PREFIX = "not run:"
NOT_RUN = "not_run"


__all__ = ["NOT_RUN", "NOT_RUN_PREFIX", "UNFINISHED", "BatchStatus", "WindowMissed"]
