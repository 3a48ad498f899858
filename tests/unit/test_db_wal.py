"""The SQLite engine's switch to WAL waits for a lock another process holds (services.db.session.set_wal)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from services.db.session import set_wal


def _reader_holding_a_lock(path: Path) -> sqlite3.Connection:
    """A connection in a read transaction on a rollback-journal database: a shared lock the WAL switch must wait
    for."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    conn.execute("BEGIN")
    conn.execute("SELECT COUNT(*) FROM t").fetchone()
    return conn


def test_the_wal_switch_waits_for_a_held_lock(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    reader = _reader_holding_a_lock(path)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)  # no busy wait: SQLite refuses at once
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("PRAGMA journal_mode=WAL")
    threading.Timer(0.3, reader.commit).start()  # the lock goes away a little later
    set_wal(other.cursor(), timeout_s=10.0)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reader.close()
    other.close()


def test_the_wal_switch_gives_up_after_its_timeout(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    reader = _reader_holding_a_lock(path)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        set_wal(other.cursor(), timeout_s=0.2, pause_s=0.02)
    reader.close()
    other.close()
