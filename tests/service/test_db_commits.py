"""STRATA_WORKER_COMMITS on a real database of each backend: a Celery worker's commits do not wait for the disk
(SQLite synchronous=NORMAL, PostgreSQL synchronous_commit=off) unless asked to; the API's always do."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from services.config import get_settings
from services.db import session as db_session


def _durability(url: str) -> str:
    with db_session.get_engine().connect() as conn:
        if url.startswith("sqlite"):
            return {2: "durable", 1: "async"}[int(conn.execute(text("PRAGMA synchronous")).scalar_one())]
        return {"on": "durable", "off": "async"}[conn.execute(text("SHOW synchronous_commit")).scalar_one()]


@pytest.mark.parametrize("setting", [None, "durable"])
def test_worker_commits_follow_the_setting_and_the_api_stays_durable(db: str, monkeypatch: pytest.MonkeyPatch,
                                                                     setting: str | None) -> None:
    if setting:
        monkeypatch.setenv("STRATA_WORKER_COMMITS", setting)
    get_settings.cache_clear()
    monkeypatch.setattr(db_session, "_worker_process", False)
    db_session.reset_engine()
    assert _durability(db) == "durable"  # the API, the CLI, migrations
    db_session.mark_worker_process()
    try:
        assert _durability(db) == (setting or "async")
        with db_session.session_scope() as s:  # commits work either way
            s.execute(text("SELECT 1"))
    finally:
        db_session.reset_engine()
        get_settings.cache_clear()


def test_an_unknown_worker_commits_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from services.config import Settings

    monkeypatch.setenv("STRATA_WORKER_COMMITS", "sometimes")
    with pytest.raises(ValidationError):
        Settings()
