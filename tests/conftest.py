"""Shared fixtures: real Redis, real database (SQLite, and PostgreSQL when STRATA_TEST_DATABASE_URL is set)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# Settings are read once per process: point everything at a private test area before any import uses them.
_TEST_ROOT = Path(tempfile.mkdtemp(prefix="strata-tests-"))
os.environ.setdefault("STRATA_REDIS_URL", os.environ.get("STRATA_TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
os.environ["STRATA_DATA_DIR"] = str(_TEST_ROOT / "var")
os.environ["STRATA_LOG_LEVEL"] = "WARNING"

PG_URL = os.environ.get("STRATA_TEST_DATABASE_URL")
BACKENDS = ["sqlite"] + (["postgresql"] if PG_URL else [])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``one_backend`` checks what a render produces (pixels, files, recipes), which no database
    changes: it runs on the last of :data:`BACKENDS` only (PostgreSQL where configured, as in CI), and its other
    backends' runs are deselected. The job lifecycle, batches and recovery still run on every backend."""
    keep, drop = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        backends = [v for v in (spec.params.values() if spec else ()) if isinstance(v, str) and v in BACKENDS]
        other = bool(backends) and backends[0] != BACKENDS[-1]
        (drop if other and item.get_closest_marker("one_backend") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def backend_url(backend: str, root: Path) -> str:
    if backend == "postgresql":
        assert PG_URL
        return PG_URL
    return f"sqlite:///{root / 'strata.db'}"


def drop_everything(url: str) -> None:
    """Every table of the database at ``url`` gone, Alembic's too (a database never migrated)."""
    from sqlalchemy import MetaData, create_engine, text

    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    with engine.begin() as conn:
        meta.drop_all(conn)
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()


_SQLITE_TEMPLATE = _TEST_ROOT / "template" / "strata.db"  # migrated once per process, copied for each database
_MIGRATED: dict[str, tuple] = {}  # PostgreSQL URL -> the schema (fingerprint) of its last full migration


def reset_database(url: str) -> None:
    """An empty, fully migrated database. SQLite: a copy of one migrated once per process. PostgreSQL: migrated in
    full once; later, while its schema is still the migrated one (a test may have dropped or changed it), every
    table emptied instead (TRUNCATE ... RESTART IDENTITY: the state of a fresh migration, no rows, ids from 1)."""
    from services.db.migrate import upgrade

    if url.startswith("sqlite"):
        _copy_sqlite_template(Path(url.split("///", 1)[1]))
    elif not _empty_if_migrated(url):
        drop_everything(url)
        upgrade(url)
        _MIGRATED[url] = _pg_schema(url)


def _copy_sqlite_template(path: Path) -> None:
    import shutil
    import sqlite3

    from services.db.migrate import upgrade

    if not _SQLITE_TEMPLATE.exists():
        _SQLITE_TEMPLATE.parent.mkdir(parents=True, exist_ok=True)
        upgrade(f"sqlite:///{_SQLITE_TEMPLATE}")
        with sqlite3.connect(_SQLITE_TEMPLATE) as conn:  # every page in the file itself (WAL mode), none in -wal
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_SQLITE_TEMPLATE, path)


_PG_SCHEMA_QUERIES = (
    "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, column_default "
    "FROM information_schema.columns "
    "WHERE table_schema = 'public' ORDER BY 1, 2",
    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2",
    "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'public' ORDER BY 1",
    "SELECT t.typname, e.enumlabel FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid ORDER BY 1, 2",
    "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2",
    "SELECT version_num FROM alembic_version",
)


def _pg_schema(url: str) -> tuple:
    """What a migration makes of the database at ``url``: tables, columns, indexes, constraints, sequences, enum
    types, triggers and the Alembic revision (an error if there is no alembic_version)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return tuple(tuple(tuple(row) for row in conn.exec_driver_sql(q)) for q in _PG_SCHEMA_QUERIES)
    finally:
        engine.dispose()


def _empty_if_migrated(url: str) -> bool:
    """Empty every table of the PostgreSQL database at ``url`` if its schema is the one its last full migration
    made; False (nothing done) when it is not, or there was none in this process."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    if url not in _MIGRATED:
        return False
    try:
        if _pg_schema(url) != _MIGRATED[url]:
            return False
    except SQLAlchemyError:  # no alembic_version: dropped
        return False
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            tables = conn.exec_driver_sql("SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' "
                                          "AND tablename <> 'alembic_version'").scalars().all()
            if tables:
                conn.exec_driver_sql(f"TRUNCATE TABLE {', '.join(tables)} RESTART IDENTITY CASCADE")
    finally:
        engine.dispose()
    return True


def restore_environment(saved: dict[str, str]) -> None:
    """Put the process environment back as it was (a module's service fixture sets STRATA_* variables) and
    forget the settings read from it, so later tests see their own."""
    from services.config import get_settings

    os.environ.clear()
    os.environ.update(saved)
    get_settings.cache_clear()


def configure(url: str, data_dir: Path) -> None:
    """Point this process's settings, engine and storage at ``url`` and ``data_dir``."""
    from services.config import get_settings
    from services.db.session import reset_engine
    from services.storage import get_storage

    os.environ["STRATA_DATABASE_URL"] = url
    os.environ["STRATA_DATA_DIR"] = str(data_dir)
    get_settings.cache_clear()
    get_storage.cache_clear()
    reset_engine()


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    url = os.environ["STRATA_REDIS_URL"]
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError as exc:  # pragma: no cover - the machine provides Redis
        pytest.fail(f"tests need a Redis at {url} (set STRATA_TEST_REDIS_URL): {exc}")
    return url


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str) -> Iterator[str]:
    """A fresh migrated database of each backend, with settings pointed at it and a private data dir."""
    url = backend_url(request.param, tmp_path)
    configure(url, tmp_path / "var")
    reset_database(url)
    yield url
    from services.db.session import reset_engine

    reset_engine()


@pytest.fixture(scope="session")
def synth_dir() -> Path:
    """Synthetic shots made once per test session with the real `synthesize_shot`."""
    from lab.synth.synth import synthesize_shot

    root = _TEST_ROOT / "synth"
    synthesize_shot("IQ3_S", root / "iq3s", scale=0.1, seed=1, noise=0.0005)
    synthesize_shot("IQ2_XS", root / "iq2xs", scale=0.1, frames=4, seed=2, noise=0.0005)
    return root


def psnr(a, b) -> float:  # type: ignore[no-untyped-def]
    import numpy as np

    mse = float(np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2))
    return 10 * float(np.log10(1.0 / max(mse, 1e-20)))


@dataclass(frozen=True)
class S3Server:
    """A real S3 HTTP endpoint on loopback (moto in server mode, a child process) and the AWS_* variables that
    point boto3 at it with dummy credentials."""

    endpoint: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    import subprocess
    import sys
    import time

    import httpx

    from workers.launcher import free_port

    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(endpoint + "/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield S3Server(endpoint, env)
    finally:
        proc.terminate()
        proc.wait(10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
