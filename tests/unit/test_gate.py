"""A GPU worker's device slots: at most ``permits`` holders, an urgent (interactive) shard served first."""

from __future__ import annotations

import threading
import time

import pytest

from services.pipeline import gate


def test_at_most_permits_hold_a_slot_at_once() -> None:
    g = gate.DeviceGate(2)
    inside, peak, lock, two_in = 0, 0, threading.Lock(), threading.Event()

    def work() -> None:
        nonlocal inside, peak
        with g.hold():
            with lock:
                inside += 1
                peak = max(peak, inside)
                if inside == 2:
                    two_in.set()
            two_in.wait(5)  # the first two meet inside; a third would raise the peak if the gate let it in
            time.sleep(0.01)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2 and g.free == 2
    with pytest.raises(ValueError, match="at least one slot"):
        gate.DeviceGate(0)


def _until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def test_an_urgent_waiter_takes_the_next_free_slot_before_batch_waiters() -> None:
    g = gate.DeviceGate(1)
    order: list[str] = []
    release = threading.Event()

    def holder() -> None:
        with g.hold():
            release.wait(5)

    def waiter(name: str, is_urgent: bool) -> None:
        with g.hold(is_urgent):
            order.append(name)

    first = threading.Thread(target=holder)
    first.start()
    _until(lambda: g.free == 0)
    batch = [threading.Thread(target=waiter, args=(f"batch{i}", False)) for i in range(2)]
    for t in batch:
        t.start()
    time.sleep(0.05)  # the batch threads (most likely) wait first; the order below holds either way
    urgent = threading.Thread(target=waiter, args=("urgent", True))
    urgent.start()
    _until(lambda: g._urgent_waiting == 1)
    release.set()
    for t in [first, *batch, urgent]:
        t.join(5)
    assert order[0] == "urgent" and sorted(order[1:]) == ["batch0", "batch1"]


def test_device_slot_reads_the_shards_urgency_and_does_nothing_without_a_gate() -> None:
    gate.configure(None)
    with gate.device_slot():  # no gate (a CPU worker): nothing to wait for
        pass
    gate.configure(1)
    try:
        token = gate.urgent.set(True)
        with gate.device_slot():
            assert gate._gate is not None and gate._gate.free == 0
        gate.urgent.reset(token)
        assert gate._gate.free == 1
    finally:
        gate.configure(None)


def test_a_reserved_slot_lets_an_urgent_shard_in_while_batch_strips_fill_the_others() -> None:
    g = gate.DeviceGate(1, reserve=1)
    release = threading.Event()
    entered: list[str] = []

    def holder(name: str, is_urgent: bool) -> None:
        with g.hold(is_urgent):
            entered.append(name)
            release.wait(5)

    batch = threading.Thread(target=holder, args=("batch0", False))
    batch.start()
    _until(lambda: entered == ["batch0"])
    second = threading.Thread(target=holder, args=("batch1", False))
    second.start()
    urgent = threading.Thread(target=holder, args=("urgent", True))
    urgent.start()
    _until(lambda: "urgent" in entered)  # in at once, beside the batch strip: the reserve is its own
    time.sleep(0.05)
    assert entered == ["batch0", "urgent"] and g.free == 0  # the second batch strip waits: batch holds at most 1
    release.set()
    for t in (batch, second, urgent):
        t.join(5)
    assert sorted(entered) == ["batch0", "batch1", "urgent"] and g.free == 1
    with pytest.raises(ValueError, match="negative"):
        gate.DeviceGate(1, reserve=-1)
