"""The disk's quiet window: while an interactive shot writes its files, batch-lane jobs hold back their TIFF writes.

An interactive shot's TIFF must reach the disk (its durable close) through the same queue as the batch's TIFFs.
Measured on one H200 host with a 100-shot batch (docs/PERFORMANCE.md, session 25): an interactive shot during the
batch took 1.99-2.12x its idle latency; with this window 1.31-1.61x, the batch as fast. The CPU side already yields
(batch encodes at nice 10); this is the disk's side. An interactive job is marked in Redis (a sorted set: job id ->
until when) while its finalize writes its outputs (:meth:`QuietWindow.holding`); a batch-lane job's writer, between
8 MB chunks of its TIFF and before its durable close, waits while any mark is live, for at most ``max_wait_s`` over
the whole job, so the batch never starves whatever the studio's interactive rate. A mark that is never removed (a
crash) lapses after ``HOLD_S``. Redis being away skips the window (logged once). Opening the window from the
interactive shot's ingest instead was measured too: the same interactive latency, 14 % less batch throughput.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import redis

log = logging.getLogger(__name__)
KEY = "strata:quiet"
HOLD_S = 10.0  # the longest a mark lives (a finalize takes well under a second; a crashed one's mark lapses)
POLL_S = 0.02  # how often a waiting writer looks again; also how long a reading is reused
RETRY_S = 30.0  # after Redis failed, how long the window is skipped before Redis is tried again


class QuietWindow:
    """Marks interactive jobs in flight and lets batch-lane writers wait for them. Thread-safe."""

    def __init__(self, client: redis.Redis, max_wait_s: float) -> None:
        self.client, self.max_wait_s = client, max_wait_s
        self._lock = threading.Lock()
        self._seen_at, self._seen = 0.0, False
        self._warned, self._down_until = False, 0.0

    def open(self, job_id: str) -> None:
        """An interactive job is in flight (from its ingest being sent until :meth:`close`, or ``HOLD_S``)."""
        if self.max_wait_s > 0:
            now = time.time()
            pipe = self.client.pipeline(transaction=False)
            pipe.zremrangebyscore(KEY, "-inf", now)  # lapsed marks of crashed jobs
            pipe.zadd(KEY, {job_id: now + HOLD_S})
            self._call(pipe.execute)
            self._forget()

    def close(self, job_id: str) -> None:
        """The job ended (or never was interactive: removing a job that is not marked costs one round trip)."""
        if self.max_wait_s > 0:
            self._call(lambda: self.client.zrem(KEY, job_id))
            self._forget()

    def _forget(self) -> None:
        """This process's last reading is stale (it changed the marks itself)."""
        with self._lock:
            self._seen_at = 0.0

    def active(self) -> bool:
        """Whether an interactive job is in flight now (a reading is reused for ``POLL_S``)."""
        now = time.monotonic()
        with self._lock:
            if now - self._seen_at < POLL_S:
                return self._seen
        wall = time.time()
        count = self._call(lambda: self.client.zcount(KEY, wall, "+inf"))  # None: Redis away, no window
        with self._lock:
            self._seen_at, self._seen = now, bool(count)
        return self._seen

    @contextlib.contextmanager
    def holding(self, job_id: str) -> Iterator[None]:
        """The window open for ``job_id`` while the block runs (closed however it ends)."""
        self.open(job_id)
        try:
            yield
        finally:
            self.close(job_id)

    def waiter(self) -> Callable[[], float]:
        """A pause for one batch-lane job's writes: each call waits while the window is open, until the job's
        ``max_wait_s`` is spent; returns the seconds it waited."""
        left = [self.max_wait_s]

        def pause() -> float:
            t0 = time.monotonic()
            while left[0] > 0 and self.active():
                time.sleep(min(POLL_S, left[0]))
                left[0] -= POLL_S
            return time.monotonic() - t0

        return pause

    def _call(self, op: Callable[[], object]) -> object | None:
        """``op()``, or None while Redis is away (then not tried again for ``RETRY_S``: no write waits on it)."""
        if time.monotonic() < self._down_until:
            return None
        try:
            return op()
        except redis.RedisError as exc:
            self._down_until = time.monotonic() + RETRY_S
            if not self._warned:
                self._warned = True
                log.warning("quiet window skipped: Redis unreachable (%s)", exc)
            return None
