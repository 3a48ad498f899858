"""Engine and session factory, one per process (a forked worker builds its own)."""

from __future__ import annotations

import os
import sqlite3
import time
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


_worker_process = False  # set in Celery workers (mark_worker_process): their commits may be asynchronous


def mark_worker_process() -> None:
    """This process is a Celery worker: its engine follows ``STRATA_WORKER_COMMITS`` (async by default). Its
    commits record steps the reconciler can redo (shard and job states, admissions): under a batch each durable
    commit waited behind the outputs' writes on the same disk (100 shots on an H200 host: 2.57 frames/s sustained
    with durable commits, 3.10 without; docs/PERFORMANCE.md)."""
    global _worker_process
    _worker_process = True
    reset_engine()


def make_engine(url: str, async_commits: bool = False, busy_timeout_s: float = 30.0) -> Engine:
    """An engine for ``url``; SQLite gets WAL mode and a busy timeout so several processes can share it.
    ``async_commits``: a commit does not wait for the disk (SQLite ``synchronous=NORMAL``, which in WAL mode syncs
    at checkpoints only; PostgreSQL ``synchronous_commit=off``); a power cut, or a PostgreSQL server crash, can
    lose the last commits, never corrupt the database."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            set_wal(cur, busy_timeout_s)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cur.execute(f"PRAGMA synchronous={'NORMAL' if async_commits else 'FULL'}")
            cur.close()

        return engine
    options = {"options": "-c synchronous_commit=off"} if async_commits and url.startswith("postgresql") else {}
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10, connect_args=options)


def set_wal(cur: Any, timeout_s: float, pause_s: float = 0.05) -> None:
    """``PRAGMA journal_mode=WAL``, tried again for up to ``timeout_s`` while SQLite says the database is locked.
    Processes opening one fresh database at once race to switch it to WAL, and SQLite can refuse the switch at once
    instead of waiting out its busy timeout (seen in CI: one of four processes migrating a fresh database at the same
    moment died with "database is locked" on this pragma)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(pause_s)


def get_engine() -> Engine:
    """The process's engine, rebuilt after a fork (connections must never cross processes)."""
    global _engine, _engine_pid, _factory
    if _engine is None or _engine_pid != os.getpid():
        settings = get_settings()
        _engine = make_engine(settings.resolved_database_url, busy_timeout_s=settings.db_busy_timeout_s,
                              async_commits=_worker_process and settings.worker_commits == "async")
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
