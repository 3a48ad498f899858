"""Migrations on a database a running studio already filled, and several processes migrating at once.

Found from outside: `strata serve` of this release on the data dir of the one before stopped with "FOREIGN KEY
constraint failed" (0009 rebuilds `batches` on SQLite, and jobs refer to it) and left `_alembic_tmp_batches` behind,
so every later try failed with "table _alembic_tmp_batches already exists"; two APIs started at once on one fresh
PostgreSQL database both created `alembic_version` and one died at start on a duplicate key."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.conftest import drop_everything

BEFORE_SEALED = "0008_service_facts"  # the release before batches.sealed


def _fresh(url: str, revision: str | None = None) -> None:
    """An empty database at ``revision`` (None: no tables at all)."""
    from services.db.migrate import upgrade

    if url.startswith("sqlite"):
        Path(url.split("///", 1)[1]).unlink(missing_ok=True)
    else:
        drop_everything(url)
    if revision is not None:
        upgrade(url, revision)


def _fill(url: str) -> None:
    """A station, a finished batch and one of its jobs, as the release before 0009 wrote them."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO stations (id, name, token_hash, created_at, role) "
                          "VALUES ('s1', 'studio-a', 'h', CURRENT_TIMESTAMP, 'station')"))
        conn.execute(text("INSERT INTO batches (id, station_id, name, status, recipes, priority, webhook_attempts, "
                          "created_at) VALUES ('b1', 's1', 'night', 'done', '[\"tiff16\"]', 'batch', 0, "
                          "CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO jobs (id, station_id, status, camera, recipe, priority, stage, phase, progress, "
                          "params, created_at, batch_id) VALUES ('j1', 's1', 'done', 'IQ3_S', 'tiff16', 'batch', "
                          "'done', 0, 1.0, '{}', CURRENT_TIMESTAMP, 'b1')"))
    engine.dispose()


def _rows(url: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        batches = [tuple(r) for r in conn.execute(text("SELECT id, status, sealed FROM batches"))]
        jobs = [tuple(r) for r in conn.execute(text("SELECT id, batch_id, status FROM jobs"))]
    engine.dispose()
    return batches, jobs


def test_a_filled_database_of_the_release_before_upgrades_and_keeps_its_rows(db: str) -> None:
    from services.db.migrate import upgrade
    from services.db.schema import schema_problem

    _fresh(db, BEFORE_SEALED)
    _fill(db)
    upgrade(db)
    assert schema_problem() is None
    assert _rows(db) == ([("b1", "done", True)], [("j1", "b1", "done")])  # an old batch is a sealed one


def test_a_migration_left_half_done_by_an_earlier_release_is_finished(db: str) -> None:
    """A SQLite database an earlier release's failed 0009 left at 0008 with its table copy still there."""
    from services.db.migrate import upgrade

    _fresh(db, BEFORE_SEALED)
    _fill(db)
    if db.startswith("sqlite"):
        engine = create_engine(db)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE _alembic_tmp_batches (id VARCHAR(32) NOT NULL PRIMARY KEY)"))
        engine.dispose()
    upgrade(db)
    assert _rows(db) == ([("b1", "done", True)], [("j1", "b1", "done")])
    engine = create_engine(db)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0010_listing_indexes"
    engine.dispose()


def test_processes_migrating_one_fresh_database_at_once_all_succeed(db: str) -> None:
    _fresh(db)
    start_at = time.time() + 4.0  # every child imports first, then all migrate at the same moment
    code = ("import sys, time; from services.db.migrate import upgrade; "
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); upgrade(sys.argv[1])")
    env = {**os.environ, "STRATA_LOG_LEVEL": "WARNING"}
    children = [subprocess.Popen([sys.executable, "-c", code, db, str(start_at)], env=env, stderr=subprocess.PIPE,
                                 text=True) for _ in range(4)]
    failed = [err for child in children if (err := child.communicate(timeout=120)[1]) and child.returncode != 0]
    assert not failed, failed[0][-2000:]
    from services.db.schema import schema_problem

    assert schema_problem() is None
