"""CPU work of batch-lane jobs at a lowered priority, so an interactive shot's work on the same host takes the
cores first (Linux CFS: nice 10 weighs about a tenth of nice 0)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def at_low_priority(work: Callable[[], T], nice: int) -> T:
    """``work()`` on a thread of its own whose CPU priority is lowered by ``nice`` (Linux: per thread, and every
    thread it starts inherits it, so the encode pools do); the caller's thread keeps its priority. ``nice`` 0, or
    a platform that refuses, runs ``work`` as it is."""
    if nice <= 0:
        return work()
    box: dict[str, object] = {}

    def run() -> None:
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: the same priority
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=run, name="strata-encode-low")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
