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
    gate = threading.Event()

    def handler(task: str, args: list[Any], kwargs: dict[str, Any], retries: int) -> None:
        if args == [666]:
            raise RuntimeError("a handler that fails")
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
        # one message at a time: while the handler holds one, the others wait in Redis, not in this process
        assert _wait(lambda: queue_depths(client, [INTERACTIVE_GPU_QUEUE])[INTERACTIVE_GPU_QUEUE] == 1)
        gate.set()
        assert _wait(lambda: len(seen) == 2 and lane.handled == 3), (seen, lane.handled)
        assert {s[1][0] for s in seen} == {1, 2}
        assert all(s[0] == "strata.run_shard" and s[2] == {"urgent": True} and s[3] == 3 for s in seen)
        assert queue_depths(client, [INTERACTIVE_GPU_QUEUE])[INTERACTIVE_GPU_QUEUE] == 0
        assert queue_depths(client, [GPU_QUEUE])[GPU_QUEUE] == 1  # the batch queue is not the lane's
        assert _wait(lambda: client.hlen("unacked") == 0), "every message handled is acknowledged"
    finally:
        lane.stop(5)
    assert not lane._thread or not lane._thread.is_alive()
