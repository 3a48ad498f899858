"""Found from outside: with Redis frozen for four minutes each coordinator logged ~4500 lines (a traceback every
1-3 s per periodic pass). An outage is now one line when it starts, one a minute while it lasts, one at its end."""

from __future__ import annotations

import logging

import pytest
import redis

from services.errors import StorageUnavailable
from workers.runtime import OutageLog


def test_an_outage_is_a_line_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    log = OutageLog(every_s=60)
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        for _ in range(50):
            log.failed("admission", redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379."))
        log.failed("retention", StorageUnavailable("storage unavailable (list): the object store does not answer"))
        log.passed("admission")
        log.passed("admission")  # no outage to end: nothing more
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["admission pass skipped: ConnectionError: Error 111 connecting to 127.0.0.1:6379.",
                     "retention pass skipped: storage unavailable (list): the object store does not answer",
                     "admission pass runs again"]
    log.failed("retention", StorageUnavailable("x"))
    log.failed("retention", StorageUnavailable("x"))
    log.every_s = 0  # the next line tells how many passes went unlogged
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        caplog.clear()
        log.failed("retention", StorageUnavailable("x"))
    assert caplog.records[0].getMessage() == "retention pass skipped: x (2 more pass(es) skipped since the last line)"
