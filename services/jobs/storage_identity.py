"""Which storage a database's files are in: one Strata service is one database with one storage.

Found from outside on two simulated hosts: a host whose STRATA_STORAGE_URL was unset (a typo'd variable: local
storage) wrote decoded frames where the other hosts could not read them, and every job of the farm failed
("intermediate ... lost"); its /readyz said ready. The storage holds a marker (:data:`MARKER_KEY`, an id) and the
database the same id (``service_facts.storage_id``): a process whose two disagree waits (workers) or is not ready
and refuses uploads (the API), saying why, instead of losing the farm's work.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from services.db.models import Job, ServiceFact, as_utc, utcnow
from services.errors import StorageUnavailable
from services.storage.base import Storage

log = logging.getLogger(__name__)
MARKER_KEY = "strata-storage.json"
FACT = "storage_id"
FIRST_START = dt.timedelta(minutes=5)  # a storage without the marker is marked this long after the record


def _marker(storage: Storage) -> str | None:
    if not storage.exists(MARKER_KEY):
        return None
    with storage.open(MARKER_KEY) as f:
        try:
            return str(json.loads(f.read().decode())["id"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return "unreadable"


def _write_marker(storage: Storage, marker: str) -> None:
    with storage.writer(MARKER_KEY) as f:
        f.write(json.dumps({"id": marker, "about": "the Strata service whose files these are"}).encode())


def storage_problem(session: Session, storage: Storage) -> str | None:
    """None when ``storage`` is the one this database's files are in; else why not, in words that say what to
    check. The first process of a service (or of one from before the marker) records an id in the database, then
    marks the storage with it; processes racing it write the same id (the database's row decides)."""
    recorded = session.get(ServiceFact, FACT)
    marker = _marker(storage)
    if recorded is None:
        if marker is None and session.scalar(select(func.count()).select_from(Job)) and \
                not any(True for _ in storage.list_sizes("jobs")):
            return ("this storage holds none of the jobs the database knows: is STRATA_STORAGE_URL (or "
                    "STRATA_STORAGE_DIR) the one every other host of this service uses?")
        session.add(ServiceFact(key=FACT, value=marker or uuid.uuid4().hex, created_at=utcnow()))
        try:
            session.commit()
        except IntegrityError:  # another process recorded it first: its id stands
            session.rollback()
        recorded = session.get(ServiceFact, FACT)
        if recorded is None:
            return None
    if marker is None and utcnow() - as_utc(recorded.created_at) < FIRST_START:
        _write_marker(storage, recorded.value)  # the service's first start: every process writes the same id
        return None
    if marker == recorded.value:
        return None
    found = "no Strata marker" if marker is None else f"the marker of another service ({marker})"
    return (f"this storage holds {found}, but this database's files are in storage {recorded.value} "
            f"({MARKER_KEY}): is STRATA_STORAGE_URL (or STRATA_STORAGE_DIR) the one every other host uses?")


_OK_FOR_S = 60.0  # a storage found to be this database's is checked again after a minute (not on every upload)
_ok_until: dict[int, float] = {}


def ensure_ours(session: Session, storage: Storage) -> None:
    """:class:`StorageUnavailable` (503) when :func:`storage_problem` finds one; a storage found right is not
    checked again for :data:`_OK_FOR_S`."""
    if time.monotonic() < _ok_until.get(id(storage), 0.0):
        return
    problem = storage_problem(session, storage)
    if problem is not None:
        raise StorageUnavailable(f"storage unavailable: {problem}")
    _ok_until[id(storage)] = time.monotonic() + _OK_FOR_S


def wait_for_storage(name: str, stopping: threading.Event, poll_s: float = 5.0) -> bool:
    """A worker's start: block until its storage is its database's (:func:`storage_problem`), saying why not at
    once and then once a minute (it takes no work meanwhile); False when ``stopping`` was set meanwhile."""
    from services.db.session import session_scope
    from services.storage import get_storage

    said = -float("inf")
    while True:
        try:
            with session_scope() as session:
                problem = storage_problem(session, get_storage())
        except (StorageUnavailable, SQLAlchemyError) as exc:  # the store or the database away: not ours to judge
            problem = f"cannot check it now ({getattr(exc, 'detail', None) or type(exc).__name__})"
        if problem is None:
            return True
        if time.monotonic() - said >= 60.0:
            log.warning("%s waits for its storage: %s", name, problem)
            said = time.monotonic()
        if stopping.wait(poll_s):
            return False


__all__ = ["MARKER_KEY", "ensure_ours", "storage_problem", "wait_for_storage"]
