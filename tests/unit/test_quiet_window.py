"""The disk's quiet window (services.jobs.quiet): batch-lane writes wait while interactive shots are in flight, within
a budget per job; against the real Redis."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from services.export.tiff import write_segments
from services.jobs.quiet import KEY, QuietWindow
from services.storage.local import LocalStorage


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    c = redis.Redis.from_url(redis_url)
    c.delete(KEY)
    yield c
    c.delete(KEY)


def test_a_batch_writer_waits_until_the_interactive_job_ends(client: redis.Redis) -> None:
    quiet = QuietWindow(client, max_wait_s=60)
    pause = quiet.waiter()
    assert pause() < 1  # nothing in flight: no wait
    quiet.open("interactive-1")
    done = threading.Event()
    writer = threading.Thread(target=lambda: (pause(), done.set()))
    writer.start()
    assert not done.wait(0.3)  # held while the interactive job is in flight
    quiet.close("interactive-1")
    assert done.wait(10)
    writer.join()
    assert not quiet.active()


def test_the_wait_is_bounded_per_job_and_marks_lapse(client: redis.Redis) -> None:
    quiet = QuietWindow(client, max_wait_s=0.1)
    quiet.open("never-ends")
    pause = quiet.waiter()
    pause()  # spends the job's budget
    t0 = time.monotonic()
    for _ in range(50):  # the mark is still there; the budget is spent, so these return at once
        assert pause() == pytest.approx(0, abs=0.5)
    assert time.monotonic() - t0 < 5
    assert quiet.waiter()() > 0  # the next job has its own budget
    client.zadd(KEY, {"never-ends": time.time() - 1})  # as after HOLD_S
    time.sleep(0.05)
    assert not quiet.active()
    quiet.open("another")  # opening sweeps lapsed marks
    assert client.zscore(KEY, "never-ends") is None


def test_off_and_without_redis_nothing_waits(client: redis.Redis) -> None:
    off = QuietWindow(client, max_wait_s=0)
    off.open("interactive-1")
    assert client.zcard(KEY) == 0
    away = QuietWindow(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), max_wait_s=60)
    away.open("interactive-1")  # logged, not raised
    assert not away.active()
    assert away.waiter()() < 5


def test_write_segments_pauses_between_chunks_and_before_the_close(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    calls: list[int] = []
    segments = [b"II*\x00" + bytes(20 << 20), memoryview(bytes(range(256)) * 4)]

    def pause() -> float:
        calls.append(1)
        return 0.0

    digest, size = write_segments(storage, "jobs/j/out/a.tif", segments, pause)
    assert size == (20 << 20) + 4 + 1024
    assert (tmp_path / "jobs/j/out/a.tif").read_bytes() == b"".join(bytes(s) for s in segments)
    assert len(calls) == 3 + 1 + 1  # three 8 MB chunks of the first segment, one of the second, the close
    assert len(digest) == 64
