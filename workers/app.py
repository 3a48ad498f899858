"""The Celery application: queues, reliability settings, worker start-up hooks."""

from __future__ import annotations

from celery import Celery

from services.config import Settings, get_settings
from workers.queues import (  # noqa: F401 - re-exported: the queue names live beside the app
    COORDINATOR_QUEUE,
    COORDINATOR_QUEUES,
    GPU_QUEUE,
    GPU_QUEUES,
    INTERACTIVE_COORDINATOR_QUEUE,
    INTERACTIVE_GPU_QUEUE,
    coordinator_queue,
    gpu_queue,
)

# Redis transport: priority 0 is served first. Level 0 is kept for repairs: work the reconciler re-dispatches
# after its worker died goes ahead of the backlog, so a lost shard finishes within seconds, not after the queue.
PRIORITIES = {"interactive": 1, "batch": 6}
REPAIR_PRIORITY = 0


def broker_url(settings: Settings) -> str:
    return settings.redis_url or "redis://127.0.0.1:6379/0"


def make_celery(settings: Settings) -> Celery:
    app = Celery("strata", broker=broker_url(settings), include=["workers.tasks"])
    app.conf.update(
        task_ignore_result=True,
        task_acks_late=True,  # a task lost with its worker is delivered again
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=COORDINATOR_QUEUE,
        task_default_priority=PRIORITIES["interactive"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            # Sweep for messages of dead workers often enough that redelivery follows the timeout closely.
            "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_s // 3)),
            "unacked_restore_throttle": 1,
            "priority_steps": list(range(10)),
            "sep": ":",
            "queue_order_strategy": "priority",
            # A broker that accepts connections but does not answer (a frozen process, a black-holed network)
            # made a publish wait forever: an upload then got no answer at all (found from outside). Commands
            # now give up after this long (the workers' blocking reads poll every second, well inside it).
            "socket_timeout": settings.broker_timeout_s,
            "socket_connect_timeout": settings.broker_timeout_s,
        },
        broker_connection_timeout=settings.broker_timeout_s,
        worker_hijack_root_logger=False,
        # Task events (and Celery's own worker heartbeats, which the launcher leaves on) so Flower shows the
        # workers and their tasks.
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
    )
    return app


celery_app = make_celery(get_settings())
