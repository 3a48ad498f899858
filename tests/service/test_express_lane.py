"""The express lane (workers/express.py) against a real Redis: it takes Celery's own shard messages off the
interactive GPU queue, at every priority level, acknowledges each once handled, and survives a bad message."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from services.config import Settings
from workers.app import PRIORITIES, REPAIR_PRIORITY, make_celery
from workers.express import ExpressLane
from workers.queues import GPU_QUEUE, INTERACTIVE_GPU_QUEUE, gpu_queue
from workers.registry import queue_depths


def _wait(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_interactive_shards_go_to_their_own_queue() -> None:
    assert gpu_queue("interactive") == INTERACTIVE_GPU_QUEUE
    assert gpu_queue("batch") == GPU_QUEUE


def test_the_lane_runs_shard_messages_of_every_priority_and_acknowledges_them(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    app = make_celery(Settings(redis_url=redis_url))
    seen: list[tuple[str, list[Any], dict[str, Any], int]] = []
    waits: dict[int, float] = {}
    gate = threading.Event()

    def handler(task: str, args: list[Any], kwargs: dict[str, Any], retries: int, wait_s: float) -> None:
        if args == [666]:
            raise RuntimeError("a handler that fails")
        waits[args[0]] = wait_s
        if wait_s > 0:  # a retry's countdown: handed on, not run (express_shard sends it to the shared queue)
            return
        gate.wait(5)
        seen.append((task, args, kwargs, retries))

    lane = ExpressLane(app, INTERACTIVE_GPU_QUEUE, handler, poll_s=0.2)
    lane.start()
    try:
        app.send_task("strata.run_shard", (666,), {"urgent": True}, queue=INTERACTIVE_GPU_QUEUE,
                      priority=PRIORITIES["interactive"])
        assert _wait(lambda: lane.handled == 1)  # dropped with a logged error; the lane goes on
        for shard, priority in ((1, PRIORITIES["interactive"]), (2, REPAIR_PRIORITY)):
            app.send_task("strata.run_shard", (shard,), {"urgent": True}, queue=INTERACTIVE_GPU_QUEUE,
                          priority=priority, retries=3)
        app.send_task("strata.run_shard", (3,), {"urgent": False}, queue=GPU_QUEUE, priority=PRIORITIES["batch"])
        app.send_task("strata.run_shard", (4,), {"urgent": True}, queue=INTERACTIVE_GPU_QUEUE, countdown=30,
                      priority=PRIORITIES["interactive"])
        # one message at a time: while the handler holds one, the others wait in Redis, not in this process
        assert _wait(lambda: queue_depths(client, [INTERACTIVE_GPU_QUEUE])[INTERACTIVE_GPU_QUEUE] == 2)
        gate.set()
        assert _wait(lambda: len(seen) == 2 and lane.handled == 4), (seen, lane.handled)
        assert 20 < waits[4] <= 30 and waits[1] == waits[2] == 0  # the countdown reaches the handler
        assert {s[1][0] for s in seen} == {1, 2}
        assert all(s[0] == "strata.run_shard" and s[2] == {"urgent": True} and s[3] == 3 for s in seen)
        assert queue_depths(client, [INTERACTIVE_GPU_QUEUE])[INTERACTIVE_GPU_QUEUE] == 0
        assert queue_depths(client, [GPU_QUEUE])[GPU_QUEUE] == 1  # the batch queue is not the lane's
        assert _wait(lambda: client.hlen("unacked") == 0), "every message handled is acknowledged"
    finally:
        lane.stop(5)
    assert not lane._thread or not lane._thread.is_alive()


def test_a_shard_not_due_yet_goes_to_the_shared_queue_at_interactive_priority(redis_url: str) -> None:
    """The lane never holds a message: one whose countdown has not run out (a retry's) is sent on to the shared
    GPU queue, whose Celery consumers keep it until due, at the interactive priority."""
    from workers.app import celery_app
    from workers.registry import queue_depths_by_priority
    from workers.tasks import express_shard

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    assert celery_app.conf.broker_url == redis_url
    express_shard("strata.run_shard", [5], {"urgent": True}, 2, 30.0)
    depths = queue_depths_by_priority(client, [GPU_QUEUE, INTERACTIVE_GPU_QUEUE], PRIORITIES)
    assert depths[GPU_QUEUE]["interactive"] == 1 and depths[INTERACTIVE_GPU_QUEUE]["interactive"] == 0
    raw = client.lrange(f"{GPU_QUEUE}:{PRIORITIES['interactive']}", 0, -1)
    assert b'"retries": 2' in raw[0] and b'"eta": "' in raw[0]
