"""Queue names, free of side effects: importing ``workers.app`` creates the Celery app for the settings of that
moment, so code that only needs a name (the launcher, in a process whose settings change) imports it from here."""

from __future__ import annotations

COORDINATOR_QUEUE = "coordinator"
# Interactive shots' coordinator steps (ingest, advance/finalize): every coordinator takes them, and an express
# coordinator (STRATA_EXPRESS_COORDINATORS) takes only them, so one never waits behind a batch's finalizes.
INTERACTIVE_COORDINATOR_QUEUE = "coordinator.interactive"
COORDINATOR_QUEUES = (INTERACTIVE_COORDINATOR_QUEUE, COORDINATOR_QUEUE)


def coordinator_queue(priority: str) -> str:
    """The coordinator queue of a job's steps by its priority (docs/OPERATIONS.md, STRATA_EXPRESS_COORDINATORS)."""
    return INTERACTIVE_COORDINATOR_QUEUE if priority == "interactive" else COORDINATOR_QUEUE


GPU_QUEUE = "gpu"  # every GPU worker's shared queue (a worker's own queue takes the shards pinned to it)
# Interactive shots' shards: every GPU worker's pool takes them ahead of the shared queue, and a GPU worker's express
# lane (STRATA_GPU_EXPRESS_LANE, workers/express.py) takes only them, so one never waits for a batch strip's thread.
INTERACTIVE_GPU_QUEUE = "gpu.interactive"
GPU_QUEUES = (INTERACTIVE_GPU_QUEUE, GPU_QUEUE)


def gpu_queue(priority: str) -> str:
    """The shared GPU queue of a job's shards by its priority."""
    return INTERACTIVE_GPU_QUEUE if priority == "interactive" else GPU_QUEUE
