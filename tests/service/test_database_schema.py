"""A database this release cannot use (found from outside: workers and coordinators said "ready" on an unreachable or
unmigrated database and failed every pass; the API answered /readyz 200 and every request 500): /readyz says why,
the API answers 503 with what to do, workers wait before they take any work."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.conftest import drop_everything


def test_an_unmigrated_database_is_not_ready_and_answers_503(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.app import create_app
    from services.config import get_settings
    from services.db.schema import schema_problem, wait_for_database
    from services.db.session import reset_engine

    assert schema_problem() is None
    drop_everything(db)
    reset_engine()
    monkeypatch.setenv("STRATA_MIGRATE_ON_START", "false")
    get_settings.cache_clear()
    assert schema_problem() == "not migrated (no Strata tables): run `strata db upgrade`"
    stopping = threading.Event()
    stopping.set()
    assert wait_for_database("gpu0@test", stopping) is False  # it waits (here: stops at once)
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "not migrated" in ready.json()["database"], ready.text
        r = client.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 503, r.text
        assert r.json()["type"] == "database_unavailable" and "strata db upgrade" in r.json()["detail"]
        assert r.headers["Retry-After"] == "5"


def test_a_database_of_another_revision_is_named(db: str) -> None:
    from services.db.schema import schema_problem
    from services.db.session import get_engine

    with get_engine().begin() as conn:
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
    assert schema_problem() == (f"at revision ffffffffffff, newer than this release knows (its latest is {head}): "
                                f"upgrade Strata here")
    with get_engine().begin() as conn:
        conn.execute(text(f"UPDATE alembic_version SET version_num = '{head}'"))
    assert schema_problem() is None
