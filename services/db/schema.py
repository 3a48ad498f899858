"""Whether the database is the one this release's code can use: reachable, and at its Alembic head revision.

Found from outside: a worker or coordinator started against an unmigrated database said "ready", then failed every
pass with `relation "batches" does not exist` (230 tracebacks in 40 s); an API answered /readyz 200 and every
request 500. Workers wait at start until :func:`schema_problem` is None; /readyz reports it; the API answers 503.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import lru_cache

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)
WAIT_LOG_S = 60.0  # a worker waiting for its database says so after QUIET_S, then once a minute
QUIET_S = 10.0  # `strata serve` starts its workers while its API migrates: a short wait is not worth a warning


@lru_cache(maxsize=1)
def _revisions() -> tuple[str | None, frozenset[str]]:
    """(head, every revision) of this release's migrations."""
    from alembic.script import ScriptDirectory

    from services.db.migrate import alembic_config

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return script.get_current_head(), frozenset(r.revision for r in script.walk_revisions())


def schema_problem(engine: Engine | None = None) -> str | None:
    """None when the database answers and is at this release's head revision; else why not, in words that say
    what to do."""
    from alembic.runtime.migration import MigrationContext

    from services.db.session import get_engine

    head, known = _revisions()
    try:
        with (engine or get_engine()).connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0][:200]
        return f"unreachable ({type(exc).__name__}: {reason})"
    if current == head:
        return None
    if current is None:
        return "not migrated (no Strata tables): run `strata db upgrade`"
    if current not in known:
        return f"at revision {current}, newer than this release knows (its latest is {head}): upgrade Strata here"
    return f"at revision {current}, this release needs {head}: run `strata db upgrade`"


def wait_for_database(name: str, stopping: threading.Event, poll_s: float = 2.0) -> bool:
    """Block until the database is usable (:func:`schema_problem`), logging why not after :data:`QUIET_S` and
    then every :data:`WAIT_LOG_S`; False when ``stopping`` was set meanwhile."""
    start = next_log = time.monotonic() + QUIET_S
    while (problem := schema_problem()) is not None:
        if time.monotonic() >= next_log:
            log.warning("%s waits for its database: %s", name, problem)
            next_log = time.monotonic() + WAIT_LOG_S
        if stopping.wait(poll_s):
            return False
    if next_log > start:
        log.info("%s: the database is ready", name)
    return True


__all__ = ["schema_problem", "wait_for_database"]
