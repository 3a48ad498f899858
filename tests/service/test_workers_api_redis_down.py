"""GET /v1/workers and /v1/queues with Redis down: found from outside as a 500 internal_error, which the dashboard
could not tell from a bug (and kept its last rows as if live). Now a 503 that names the broker."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from services.db.session import session_scope
from services.stations import create_station_token


@pytest.fixture
def redis_down(db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The settings' broker pointed at a loopback port nothing listens on (connections are refused at once)."""
    from services.config import get_settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("STRATA_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    get_settings.cache_clear()
    yield db
    get_settings.cache_clear()  # monkeypatch puts the variable back after this


def test_workers_and_queues_answer_503_when_redis_is_down(redis_down: str) -> None:
    from api.app import create_app

    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'station-a')}"}
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        for path in ("/v1/workers", "/v1/queues"):
            r = client.get(path, headers=auth)
            assert r.status_code == 503, (path, r.text)
            body = r.json()
            assert body["type"] == "broker_unavailable" and "Redis" in body["detail"], body
            assert r.headers["Retry-After"] == "5"
