"""With Redis away the failed-auth back-off is skipped, said once a minute per kind (found from outside: every
authenticated request logged a warning, six lines a second from one dashboard)."""

from __future__ import annotations

import logging

import pytest
import redis

from services import auth_backoff
from services.auth_backoff import AuthBackoff, BackoffPolicy


def test_redis_away_is_said_once_a_minute(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_backoff, "_warned", {})
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    away = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, socket_timeout=0.2,
                       retry=Retry(NoBackoff(), 0))
    backoff = AuthBackoff(away, BackoffPolicy(5, 1.0, 60.0))
    with caplog.at_level(logging.WARNING, logger="services.auth_backoff"):
        for _ in range(3):
            backoff.check("10.0.0.1")  # skipped, not refused
            backoff.succeeded("10.0.0.1")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "skipped" in said[0] and "not reset" in said[1]
