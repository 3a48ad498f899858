"""One service is one database with one storage (found from outside on two simulated hosts: a host whose
STRATA_STORAGE_URL was unset wrote to its local disk, and every job of the farm failed while /readyz said ready).
The storage's marker and the database's record must agree; workers wait, the API is not ready and refuses uploads."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from services.db.models import Job, ServiceFact, Station, utcnow
from services.db.session import session_scope
from services.errors import StorageUnavailable
from services.jobs.storage_identity import MARKER_KEY, ensure_ours, storage_problem, wait_for_storage
from services.storage import LocalStorage, get_storage


def test_the_first_process_marks_both_and_another_storage_is_named(db: str, tmp_path: Path) -> None:
    ours = get_storage()
    with session_scope() as session:
        assert storage_problem(session, ours) is None  # the first: marks the storage and the database
        assert ours.exists(MARKER_KEY) and storage_problem(session, ours) is None
        fact = session.get(ServiceFact, "storage_id")
        fact.created_at = utcnow() - dt.timedelta(hours=1)  # past the first start's minutes
        session.commit()
        other = LocalStorage(tmp_path / "elsewhere")
        problem = storage_problem(session, other)
        assert problem is not None and "holds no Strata marker" in problem and "STRATA_STORAGE_URL" in problem
        assert not other.exists(MARKER_KEY)  # nothing written where it is not ours
        try:
            ensure_ours(session, other)
            raise AssertionError("a storage that is not this database's passed")
        except StorageUnavailable as exc:
            assert exc.status_code == 503
    stopping = threading.Event()
    stopping.set()
    assert wait_for_storage("gpu0@test", stopping) is True  # the configured storage is ours


def test_a_database_with_jobs_is_not_marked_from_an_empty_storage(db: str, tmp_path: Path) -> None:
    """A service from before the marker: the first process to check marks both, unless its storage holds none of
    the database's jobs (the misconfigured host starting first)."""
    with session_scope() as session:
        station = Station(name="s", token_hash="s")
        session.add(station)
        session.flush()
        session.add(Job(id="a" * 32, station_id=station.id, status="done", camera="IQ3_S", recipe="tiff16",
                        priority="batch", params={}))
        session.commit()
        empty = LocalStorage(tmp_path / "empty")
        problem = storage_problem(session, empty)
        assert problem is not None and "holds none of the jobs the database knows" in problem
        with get_storage().writer(f"jobs/{'a' * 32}/frames/00_a.dng") as f:
            f.write(b"raw")
        assert storage_problem(session, get_storage()) is None  # the storage that holds them is marked


def test_processes_starting_together_agree(db: str) -> None:
    """Found in the test suite: sixty first uploads at once each wrote their own id and most were refused."""
    from concurrent.futures import ThreadPoolExecutor

    def check(_: int) -> str | None:
        with session_scope() as session:
            return storage_problem(session, get_storage())

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(check, range(16))) == [None] * 16
    with session_scope() as session:
        assert storage_problem(session, get_storage()) is None
