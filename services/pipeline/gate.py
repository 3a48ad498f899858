"""A GPU worker's device slots: how many of its threads issue device work at once.

A GPU worker runs more threads than it lets onto the device (``STRATA_GPU_WORKER_THREADS`` slots plus
``STRATA_GPU_OVERLAP_THREADS``): a strip holds a slot while it renders on the device, then stores its results (the
TIFF tile streams, proof bins, preview sums: about a third of its time in a batch) without it, so the next strip's
model pass runs meanwhile and the device memory still holds at most ``slots`` renders. A thread computing an
interactive shot's shard (:data:`urgent`) takes the next free slot before any batch thread waiting for one, and
``reserve`` more slots (``STRATA_GPU_URGENT_SLOTS``) are kept for such shards alone: batch strips hold at most
``permits``, so an interactive strip does not wait for a batch strip to leave the device.
While an interactive shard holds a slot, a batch shard pauses at its next :func:`yield_to_urgent` (between the model
passes of a self-ensemble, before its bins and tiles; ``STRATA_GPU_URGENT_YIELD_S`` seconds at most each time, 0:
never), so the interactive strip has the device to itself instead of sharing its SMs with the batch's kernels.
Without :func:`configure` (CPU workers, tests) :func:`device_slot` does nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

urgent: ContextVar[bool] = ContextVar("strata_urgent_shard", default=False)  # set by the worker per shard


class DeviceGate:
    """``permits`` slots for anyone plus ``reserve`` for urgent holders only; urgent holders are served first."""

    def __init__(self, permits: int, reserve: int = 0, yield_s: float = 0.0) -> None:
        if permits < 1:
            raise ValueError(f"a device gate needs at least one slot, got {permits}")
        if reserve < 0:
            raise ValueError(f"a device gate's reserve cannot be negative, got {reserve}")
        self.permits = permits
        self.reserve = reserve
        self.yield_s = yield_s  # the longest a batch holder pauses at one yield point for urgent holders
        self._held = 0
        self._urgent_held = 0
        self._urgent_waiting = 0
        self._cond = threading.Condition()

    def _blocked(self, is_urgent: bool) -> bool:
        if is_urgent:
            return self._held >= self.permits + self.reserve
        return self._held >= self.permits or self._urgent_waiting > 0

    @contextmanager
    def hold(self, is_urgent: bool = False) -> Iterator[None]:
        with self._cond:
            self._urgent_waiting += is_urgent
            try:
                while self._blocked(is_urgent):
                    self._cond.wait()
            finally:
                self._urgent_waiting -= is_urgent
            self._held += 1
            self._urgent_held += is_urgent
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._urgent_held -= is_urgent
                self._cond.notify_all()

    def pause_for_urgent(self) -> float:
        """Wait while an urgent holder is on the device, :attr:`yield_s` at most; the seconds waited. Only urgent
        *holders* count: one waiting for a slot gets the next one freed, so a batch holder must not wait for it."""
        if self.yield_s <= 0 or self._urgent_held == 0:  # (read without the lock: the common case costs nothing)
            return 0.0
        start = time.monotonic()
        deadline = start + self.yield_s
        with self._cond:
            while self._urgent_held > 0 and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
        return time.monotonic() - start

    @property
    def free(self) -> int:
        """Slots a batch holder could take now."""
        return max(0, self.permits - self._held)


_gate: DeviceGate | None = None


def configure(permits: int | None, reserve: int = 0, yield_s: float = 0.0) -> None:
    """Set this process's gate (``permits`` slots and ``reserve`` for urgent shards, batch shards pausing up to
    ``yield_s`` at each yield point while an urgent one computes; None: no gate)."""
    global _gate
    _gate = DeviceGate(permits, reserve, yield_s) if permits else None


@contextmanager
def device_slot() -> Iterator[None]:
    """Hold one of this process's device slots (urgent first, :data:`urgent`); nothing without a gate."""
    gate = _gate
    if gate is None:
        yield
        return
    with gate.hold(urgent.get()):
        yield


def yield_to_urgent() -> float:
    """A batch shard's pause point: wait while an interactive shard holds a device slot of this process (bounded,
    :class:`DeviceGate`); the seconds waited. Nothing for an urgent shard or without a gate."""
    gate = _gate
    if gate is None or urgent.get():
        return 0.0
    waited = gate.pause_for_urgent()
    if waited > 0.001:
        _paused.seconds = getattr(_paused, "seconds", 0.0) + waited
    return waited


_paused = threading.local()  # this thread's pauses since the last paused_seconds()


def paused_seconds() -> float:
    """This thread's pauses at yield points since the last call (for the strip's log line), and reset."""
    seconds = getattr(_paused, "seconds", 0.0)
    _paused.seconds = 0.0
    return seconds


__all__ = ["DeviceGate", "configure", "device_slot", "paused_seconds", "urgent", "yield_to_urgent"]
