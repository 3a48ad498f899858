"""Engine and session factory, one per process (a forked worker builds its own)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Executable, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from services.config import get_settings

_engine: Engine | None = None
_engine_pid: int | None = None
_factory: sessionmaker[Session] | None = None


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL mode and a busy timeout so several processes can share it."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def get_engine() -> Engine:
    """The process's engine, rebuilt after a fork (connections must never cross processes)."""
    global _engine, _engine_pid, _factory
    if _engine is None or _engine_pid != os.getpid():
        _engine = make_engine(get_settings().resolved_database_url)
        _engine_pid = os.getpid()
        _factory = sessionmaker(_engine, expire_on_commit=False)
    return _engine


def reset_engine() -> None:
    """Forget the engine (tests and settings changes)."""
    global _engine, _engine_pid, _factory
    if _engine is not None and _engine_pid == os.getpid():
        _engine.dispose()
    _engine = _engine_pid = _factory = None


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    get_engine()
    assert _factory is not None
    session = _factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def execute_update(session: Session, statement: Executable) -> int:
    """Run an UPDATE and return how many rows it changed (the basis of every conditional state move)."""
    return int(cast(CursorResult[Any], session.execute(statement)).rowcount)


def get_session() -> Iterator[Session]:
    """FastAPI dependency."""
    with session_scope() as session:
        yield session
