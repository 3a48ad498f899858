"""A GPU worker's device slots: how many of its threads issue device work at once.

A GPU worker runs more threads than it lets onto the device (``STRATA_GPU_WORKER_THREADS`` slots plus
``STRATA_GPU_OVERLAP_THREADS``): a strip holds a slot while it renders on the device, then stores its results (the
TIFF tile streams, proof bins, preview sums: about a third of its time in a batch) without it, so the next strip's
model pass runs meanwhile and the device memory still holds at most ``slots`` renders. A thread computing an
interactive shot's shard (:data:`urgent`) takes the next free slot before any batch thread waiting for one, and
``reserve`` more slots (``STRATA_GPU_URGENT_SLOTS``) are kept for such shards alone: batch strips hold at most
``permits``, so an interactive strip does not wait for a batch strip to leave the device.
Without :func:`configure` (CPU workers, tests) :func:`device_slot` does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

urgent: ContextVar[bool] = ContextVar("strata_urgent_shard", default=False)  # set by the worker per shard


class DeviceGate:
    """``permits`` slots for anyone plus ``reserve`` for urgent holders only; urgent holders are served first."""

    def __init__(self, permits: int, reserve: int = 0) -> None:
        if permits < 1:
            raise ValueError(f"a device gate needs at least one slot, got {permits}")
        if reserve < 0:
            raise ValueError(f"a device gate's reserve cannot be negative, got {reserve}")
        self.permits = permits
        self.reserve = reserve
        self._held = 0
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
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    @property
    def free(self) -> int:
        """Slots a batch holder could take now."""
        return max(0, self.permits - self._held)


_gate: DeviceGate | None = None


def configure(permits: int | None, reserve: int = 0) -> None:
    """Set this process's gate (``permits`` slots and ``reserve`` for urgent shards; None: no gate)."""
    global _gate
    _gate = DeviceGate(permits, reserve) if permits else None


@contextmanager
def device_slot() -> Iterator[None]:
    """Hold one of this process's device slots (urgent first, :data:`urgent`); nothing without a gate."""
    gate = _gate
    if gate is None:
        yield
        return
    with gate.hold(urgent.get()):
        yield


__all__ = ["DeviceGate", "configure", "device_slot", "urgent"]
