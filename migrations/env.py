"""Alembic environment: the URL comes from Strata's settings (or the caller's config)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from services.config import get_settings
from services.db.models import Base
from services.db.session import make_engine

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


# Any fixed number: PostgreSQL's advisory lock that serialises Strata's migrations across processes and hosts.
MIGRATION_LOCK_KEY = 0x5374726174610001


def _drop_half_done_tables(connection: Connection) -> None:
    """Drop the copies a batch migration of an earlier release left behind when it failed without a transaction
    (else every later try stops at "table _alembic_tmp_batches already exists"); under BEGIN IMMEDIATE no other
    migration is running."""
    names = connection.exec_driver_sql(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '\\_alembic\\_tmp\\_%' ESCAPE '\\'"
    ).scalars().all()
    for name in names:
        connection.exec_driver_sql(f'DROP TABLE "{name}"')


def run_migrations_online() -> None:
    connectable = make_engine(_url())
    with connectable.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # A batch migration rebuilds its table (copy, drop, rename); with foreign keys enforced the drop of a
            # table other rows refer to fails (found from outside: 0009 on a database holding batches failed with
            # "FOREIGN KEY constraint failed" and left _alembic_tmp_batches behind). Checked once at the end.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()  # else Alembic takes the connection's open transaction for the caller's own
        # SQLite runs DDL in transactions too, but its driver opens none for it: without one, a migration that
        # failed half-way left its half behind (a second try: "table _alembic_tmp_batches already exists").
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                          transactional_ddl=True)
        with context.begin_transaction():
            # Two processes starting on one fresh database (APIs with STRATA_MIGRATE_ON_START, hosts running
            # `strata token create`) both created alembic_version and one died on a duplicate key: the second waits
            # here for the first's commit, then reads the revision it left.
            if sqlite:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                _drop_half_done_tables(connection)
            elif connection.dialect.name == "postgresql":
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
            context.run_migrations()
            if sqlite and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
                raise RuntimeError(f"the migration left rows whose foreign keys point nowhere: {broken[:5]}")
    connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
