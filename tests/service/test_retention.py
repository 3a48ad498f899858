"""Retention: left-behind intermediates swept, expired uploads and outputs pruned (a referenced job's never), the
pruned output answers 410, and `strata storage usage / prune` report the same."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.db.models import Job, Output, Station, utcnow
from services.db.session import session_scope
from services.errors import Gone
from services.jobs import retention
from services.jobs.service import output_of
from services.storage import get_storage
from services.storage.base import Storage


def _job(session, station: Station, status: str, finished_days_ago: float | None) -> Job:  # type: ignore[no-untyped-def]
    finished = None if finished_days_ago is None else utcnow() - dt.timedelta(days=finished_days_ago)
    job = Job(id=uuid.uuid4().hex, station_id=station.id, status=status, camera="IQ3_S", recipe="tiff16",
              priority="batch", finished_at=finished, params={})
    job.outputs = [Output(name="frame_00.tif", storage_key=f"jobs/{job.id}/out/frame_00.tif", sha256="0" * 64,
                          bytes=4)]
    session.add(job)
    return job


def _store(storage: Storage, job_id: str, *folders: str) -> None:
    names = {"frames": "00_a.dng", "out": "frame_00.tif", "raw": "00.npy", "p1": "strip_000.npy"}
    for folder in folders:
        with storage.writer(f"jobs/{job_id}/{folder}/{names[folder]}") as f:
            f.write(b"1234")


def _keys(storage: Storage, job_id: str) -> list[str]:
    return sorted(k.split("/", 2)[2] for k, _ in storage.list_sizes(f"jobs/{job_id}"))


def _jobs(storage: Storage) -> dict[str, str]:
    with session_scope() as session:
        station = Station(name="s", token_hash="s")
        session.add(station)
        session.flush()
        ids = {name: _job(session, station, status, days).id for name, status, days in [
            ("expired", "done", 40), ("recent", "done", 1), ("referenced", "running", 40),
            ("crashed", "failed", 2), ("active", "running", None)]}
    for name in ("expired", "recent", "referenced"):
        _store(storage, ids[name], "frames", "out")
    _store(storage, ids["crashed"], "frames", "raw", "p1")
    _store(storage, ids["active"], "frames", "raw")
    return ids


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The configured storage: local files, or a bucket on the moto server."""
    from services.config import get_settings

    if request.param == "s3":
        request.getfixturevalue("s3_server")
        monkeypatch.setenv("STRATA_STORAGE_URL", f"s3://retention-{uuid.uuid4().hex[:8]}/studio")
        monkeypatch.setenv("STRATA_S3_CREATE_BUCKET", "true")
    get_settings.cache_clear()
    get_storage.cache_clear()
    yield request.param
    get_settings.cache_clear()
    get_storage.cache_clear()


def test_retention_pass_sweeps_and_prunes(backend: str) -> None:
    storage = get_storage()
    ids = _jobs(storage)
    assert retention.usage(storage) == {"uploads": 20, "intermediates": 12, "outputs": 12, "other": 0, "scratch": 0}
    with session_scope() as session:
        dry = retention.prune(session, storage, older_than_days=30, dry_run=True)
    assert dry.jobs == [ids["expired"]] and dry.bytes == 8 and dry.kept_referenced == [ids["referenced"]]
    assert _keys(storage, ids["expired"]) == ["frames/00_a.dng", "out/frame_00.tif"]  # a dry run removes nothing
    with session_scope() as session:
        report = retention.retention_pass(session, storage, retention_days=30)
    assert report.jobs == [ids["expired"]] and report.intermediates_swept == [ids["crashed"]]
    assert _keys(storage, ids["expired"]) == []
    assert _keys(storage, ids["crashed"]) == ["frames/00_a.dng"]
    assert _keys(storage, ids["active"]) == ["frames/00_a.dng", "raw/00.npy"]  # still running: untouched
    assert _keys(storage, ids["referenced"]) == ["frames/00_a.dng", "out/frame_00.tif"]
    assert _keys(storage, ids["recent"]) == ["frames/00_a.dng", "out/frame_00.tif"]
    with session_scope() as session:
        expired = session.get(Job, ids["expired"])
        assert expired is not None and expired.pruned_at is not None
        with pytest.raises(Gone):
            output_of(expired, "frame_00.tif")
        recent = session.get(Job, ids["recent"])
        assert recent is not None and output_of(recent, "frame_00.tif").deleted_at is None
    with session_scope() as session:
        assert retention.retention_pass(session, storage, retention_days=30).jobs == []  # once only
        assert retention.retention_pass(session, storage, retention_days=0).jobs == []  # 0 = keep forever


def test_a_retention_pass_lists_the_storage_once(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object store lists 1000 keys a request: the sweeps and the prune share one listing of "jobs" (each
    step listed it anew before), and do the same work with it."""
    storage = get_storage()
    ids = _jobs(storage)
    calls: list[str] = []
    real = storage.list_sizes

    def counted(prefix: str = "") -> Iterator[tuple[str, int]]:
        calls.append(prefix)
        return real(prefix)

    monkeypatch.setattr(storage, "list_sizes", counted)
    with session_scope() as session:
        report = retention.retention_pass(session, storage, retention_days=30)
    assert calls.count("jobs") == 1  # one listing of everything (removing a job's files lists that job's folder)
    assert report.jobs == [ids["expired"]] and report.bytes == 8 and report.intermediates_swept == [ids["crashed"]]


def test_storage_cli_usage_and_prune(backend: str, tmp_path: Path) -> None:
    from cli.main import app

    ids = _jobs(get_storage())
    runner = CliRunner()
    shown = runner.invoke(app, ["storage", "usage"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "uploads" in shown.output and "intermediates" in shown.output and "scratch" in shown.output
    dry = runner.invoke(app, ["storage", "prune", "--dry-run", "--older-than", "30"], terminal_width=200)
    assert dry.exit_code == 0, dry.output
    assert f"would remove job {ids['expired']}" in dry.output and ids["recent"] not in dry.output
    assert _keys(get_storage(), ids["expired"]) != []
    done = runner.invoke(app, ["storage", "prune", "--older-than", "0.5"], terminal_width=200)
    assert done.exit_code == 0, done.output
    assert _keys(get_storage(), ids["recent"]) == [] and _keys(get_storage(), ids["referenced"]) != []


def test_a_shot_of_an_open_batch_is_kept_until_the_batch_ends(db: str) -> None:
    from services.db.models import Batch

    storage = get_storage()
    with session_scope() as session:
        station = Station(name="b", token_hash="b")
        session.add(station)
        session.flush()
        batch = Batch(station_id=station.id, name="night", status="running", recipes=["tiff16"])
        session.add(batch)
        session.flush()
        job = _job(session, station, "done", 40)
        job.batch_id = batch.id
        job_id, batch_id = job.id, batch.id
    _store(storage, job_id, "frames", "out")
    with session_scope() as session:
        report = retention.prune(session, storage, older_than_days=30)
        assert report.kept_referenced == [job_id] and report.jobs == []
        session.get(Batch, batch_id).status = "done"
    with session_scope() as session:
        assert retention.prune(session, storage, older_than_days=30).jobs == [job_id]
    assert _keys(storage, job_id) == []


def test_the_sweep_of_jobs_just_ended_spares_a_live_writers_file(db: str, tmp_path: Path) -> None:
    """The final preview is written after its job is marked done: the reconciler's sweep of recently ended jobs
    must not delete that live writer's file (a busy host's preview write failed with FileNotFoundError), while
    a killed writer's stale file goes."""
    import os
    import time

    from services.storage.local import LocalStorage

    storage = LocalStorage(tmp_path / "store")
    with session_scope() as session:
        station = Station(name="s", token_hash="s")
        session.add(station)
        session.flush()
        job_id = _job(session, station, "done", 0).id
    _store(storage, job_id, "raw")
    root = tmp_path / "store" / "jobs" / job_id
    stale, live = root / ".part-aaaa-preview.jpg", root / ".part-bbbb-preview.jpg"
    stale.write_bytes(b"x")
    live.write_bytes(b"y")
    old = time.time() - 30
    os.utime(stale, (old, old))
    with session_scope() as session:
        assert retention.sweep_recently_ended(session, storage, within_s=60, partials_older_than_s=10) == [job_id]
    assert live.exists() and not stale.exists() and _keys(storage, job_id) == []


def test_files_written_after_a_removal_are_dropped_again(db: str) -> None:
    """A job's files removed while its finalize still wrote the final preview: the finalize's last step deletes
    what came after the removal; a job not removed keeps its files."""
    storage = get_storage()
    with session_scope() as session:
        station = Station(name="r", token_hash="r")
        session.add(station)
        session.flush()
        removed, kept = _job(session, station, "done", 0).id, _job(session, station, "done", 0).id
    for job_id in (removed, kept):
        _store(storage, job_id, "out")
    with session_scope() as session:
        retention.discard(session, storage, session.get(Job, removed))
    _store(storage, removed, "out")  # written by the finalize after the removal
    with session_scope() as session:
        assert retention.drop_if_removed(session, storage, removed)
        assert not retention.drop_if_removed(session, storage, kept)
    assert _keys(storage, removed) == [] and _keys(storage, kept) == ["out/frame_00.tif"]


def test_files_are_removed_when_the_database_shares_a_full_disk(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: with SQLite on the full disk, marking the job before deleting could not commit, so the
    documented way to free space (DELETE /v1/jobs/{id}/files) answered 503 for as long as the disk was full. The
    files go first there, which gives the database room, then the marks."""
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    storage = get_storage()
    with session_scope() as session:
        station = Station(name="full", token_hash="full")
        session.add(station)
        session.flush()
        job_id = _job(session, station, "done", 0).id
    _store(storage, job_id, "out")
    real, failures = Session.commit, iter([True])

    def commit(self: Session) -> None:
        if next(failures, False):  # the first commit: the disk is full
            raise OperationalError("COMMIT", {}, Exception("database or disk is full"))
        real(self)

    monkeypatch.setattr(Session, "commit", commit)
    with session_scope() as session:
        retention.discard(session, storage, session.get(Job, job_id))
    monkeypatch.undo()
    assert _keys(storage, job_id) == []
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.pruned_at is not None


def test_a_half_written_upload_without_a_job_is_swept(db: str, tmp_path: Path) -> None:
    """Found from outside: the API killed mid-upload left jobs/<id>/frames/.part-…-<name> with no job row, never
    swept (retention goes by job rows). The retention pass removes half-written files untouched for an hour."""
    import os
    import time

    from services.storage import LocalStorage

    storage = LocalStorage(tmp_path / "storage")
    orphan = tmp_path / "storage" / "jobs" / uuid.uuid4().hex / "frames" / ".part-1234abcd-00_big.dng"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"half a frame")
    live = orphan.with_name(".part-5678abcd-00_other.dng")
    live.write_bytes(b"being written")
    old = time.time() - retention.STALE_PARTIAL_S - 60
    os.utime(orphan, (old, old))
    with session_scope() as session:
        report = retention.retention_pass(session, storage, retention_days=0)
    assert report.partials_swept == 1 and not orphan.exists() and live.exists()


def test_uploads_no_job_row_knows_are_swept_once_stale(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: an API killed after storing a shot and before recording its job left the whole upload
    for ever (retention goes by job rows). Only folders of uploads alone go, once untouched for the age given;
    a listing of more orphans than the limit (another database) removes nothing."""
    storage = get_storage()
    with session_scope() as session:
        station = Station(name="s", token_hash="s")
        session.add(station)
        session.flush()
        failed = _job(session, station, "failed", 1).id  # a job failed at decode: uploads alone, but recorded
    orphan, with_output = uuid.uuid4().hex, uuid.uuid4().hex
    _store(storage, failed, "frames")
    _store(storage, orphan, "frames")
    _store(storage, with_output, "frames", "out")
    with session_scope() as session:
        assert retention.sweep_orphan_uploads(session, storage, older_than_s=3600) == []  # just written
        assert retention.sweep_orphan_uploads(session, storage, older_than_s=-60) == [orphan]
    assert _keys(storage, orphan) == [] and _keys(storage, failed) == ["frames/00_a.dng"]
    assert _keys(storage, with_output) == ["frames/00_a.dng", "out/frame_00.tif"]
    monkeypatch.setattr(retention, "ORPHAN_SWEEP_LIMIT", 2)
    many = [uuid.uuid4().hex for _ in range(3)]
    for job_id in many:
        _store(storage, job_id, "frames")
    with session_scope() as session:
        assert retention.sweep_orphan_uploads(session, storage, older_than_s=-60) == []
    assert all(_keys(storage, job_id) == ["frames/00_a.dng"] for job_id in many)
