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


def test_a_batch_holder_pauses_while_an_urgent_holder_is_on_the_device() -> None:
    g = gate.DeviceGate(2, yield_s=5.0)
    events: list[str] = []
    urgent_in, urgent_done = threading.Event(), threading.Event()

    def urgent_shard() -> None:
        with g.hold(True):
            urgent_in.set()
            time.sleep(0.1)
            events.append("urgent done")
            urgent_done.set()

    with g.hold():  # a batch strip on the device
        assert g.pause_for_urgent() == 0.0  # no urgent holder: no pause
        t = threading.Thread(target=urgent_shard)
        t.start()
        urgent_in.wait(5)
        waited = g.pause_for_urgent()
        events.append("batch resumed")
    t.join(5)
    assert events == ["urgent done", "batch resumed"] and waited > 0.05


def test_the_pause_is_bounded_off_by_default_and_not_for_an_urgent_waiter() -> None:
    g = gate.DeviceGate(1, yield_s=0.05)
    release = threading.Event()

    def urgent_holder() -> None:
        with g.hold(True):
            release.wait(5)

    t = threading.Thread(target=urgent_holder)
    t.start()
    _until(lambda: g._urgent_held == 1)
    start = time.monotonic()
    assert 0.04 < g.pause_for_urgent() < 2 and time.monotonic() - start < 2  # bounded by yield_s
    release.set()
    t.join(5)
    assert gate.DeviceGate(1).pause_for_urgent() == 0.0  # yield_s 0: never pauses
    # an urgent shard only *waiting* for a slot does not pause the holders: they must free one for it
    g2 = gate.DeviceGate(1, yield_s=5.0)
    with g2.hold():
        waiter = threading.Thread(target=lambda: g2.hold(True).__enter__())
        waiter.daemon = True
        waiter.start()
        _until(lambda: g2._urgent_waiting == 1)
        assert g2.pause_for_urgent() == 0.0


def test_yield_to_urgent_counts_a_batch_shards_pauses_and_skips_urgent_shards() -> None:
    gate.configure(None)
    assert gate.yield_to_urgent() == 0.0  # no gate (a CPU worker)
    gate.configure(2, 0, 5.0)
    try:
        release = threading.Event()

        def urgent_holder() -> None:
            token = gate.urgent.set(True)
            try:
                with gate.device_slot():
                    release.wait(5)
            finally:
                gate.urgent.reset(token)

        t = threading.Thread(target=urgent_holder)
        t.start()
        _until(lambda: gate._gate is not None and gate._gate._urgent_held == 1)
        token = gate.urgent.set(True)
        assert gate.yield_to_urgent() == 0.0  # an urgent shard never pauses for another
        gate.urgent.reset(token)
        gate.paused_seconds()
        threading.Timer(0.1, release.set).start()
        assert gate.yield_to_urgent() > 0.05
        t.join(5)
        assert gate.paused_seconds() > 0.05 and gate.paused_seconds() == 0.0
    finally:
        gate.configure(None)
