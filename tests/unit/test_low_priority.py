"""A batch shot's encode runs at a lowered CPU priority on a thread of its own (services.jobs.lowprio)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from services.jobs.lowprio import at_low_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_work_and_the_threads_it_starts_run_lowered_and_the_caller_keeps_its_priority() -> None:
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []

    def child() -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    def work() -> str:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        t = threading.Thread(target=child)
        t.start()
        t.join()
        return "written"

    assert at_low_priority(work, 10) == "written"
    assert seen == [min(19, before + 10)] * 2
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_errors_reach_the_caller_and_nice_zero_runs_in_place() -> None:
    def fail() -> None:
        raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        at_low_priority(fail, 10)
    assert at_low_priority(threading.get_native_id, 0) == threading.get_native_id()
