"""An object store that is away, refuses, or lacks the bucket (found from outside with a fault proxy in front of a
moto server): a clear StorageUnavailable (503 + Retry-After at the API, a retry with back-off in the workers), a
typo'd bucket not created, readiness that says so, and a removal of a job's files that fails leaves them marked
present rather than orphaned. "Down" here is a real boto3 client pointed at a closed port on loopback."""

from __future__ import annotations

import hashlib
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from fastapi.testclient import TestClient

from services.config import get_settings
from services.db.models import Job, Output, Station, utcnow
from services.db.session import session_scope
from services.errors import StorageUnavailable
from services.jobs.retention import discard
from services.stations import create_station_token
from services.storage import get_storage
from services.storage.s3 import GuardedClient, S3Storage
from services.storage.scratch import ScratchCache
from tests.conftest import S3Server


def _dead_client(bucket: str) -> GuardedClient:
    from workers.launcher import free_port

    port = free_port()  # nothing listens there
    return GuardedClient(boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", config=Config(
        retries={"max_attempts": 1}, connect_timeout=1, read_timeout=1)), bucket)


def _storage(tmp_path: Path, create: bool = True) -> S3Storage:
    return S3Storage(f"outage-{uuid.uuid4().hex[:8]}", "studio", ScratchCache(tmp_path / "scratch", 64 << 20),
                     create_bucket=create)


def test_a_missing_bucket_is_refused_not_created(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = f"typo-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorageUnavailable, match=f"bucket '{bucket}' does not exist.*STRATA_S3_CREATE_BUCKET"):
        S3Storage(bucket, "studio", ScratchCache(tmp_path / "scratch", 1 << 20))
    names = [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]
    assert bucket not in names


def test_a_store_that_is_away_is_storage_unavailable(s3_server: S3Server, tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    with storage.writer("jobs/a/out/x.tif") as f:
        f.write(b"x" * 100)
    storage.check()
    live = storage.client
    storage.client = _dead_client(storage.bucket)
    for call in (storage.check, lambda: storage.exists("jobs/a/out/x.tif"), lambda: storage.size("jobs/a/out/x.tif"),
                 lambda: list(storage.list_sizes("jobs")), lambda: storage.delete_prefix("jobs/a"),
                 lambda: list(storage.iter_chunks("jobs/a/out/x.tif"))):
        with pytest.raises(StorageUnavailable, match="does not answer"):
            call()
    with pytest.raises(StorageUnavailable), storage.writer("jobs/a/out/y.tif") as f:
        f.write(b"y" * (6 << 20))  # past a part: the multipart upload cannot start
    storage.client = live
    assert storage.exists("jobs/a/out/x.tif") and not storage.exists("jobs/a/out/y.tif")  # a missing key: False


def _cutting_client(bucket: str) -> tuple[GuardedClient, socket.socket]:
    """A client of a store that answers every request with a 1000-byte object and cuts its body off after 10."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\nContent-Range: bytes 0-999/1000"
                             b"\r\nContent-Type: binary/octet-stream\r\n\r\n" + b"x" * 10)

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    return GuardedClient(boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", config=Config(
        retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)), bucket), listener


def test_a_body_cut_off_mid_read_is_storage_unavailable(s3_server: S3Server, tmp_path: Path) -> None:
    """Found in review: a connection that broke while an object's body was read raised botocore's own
    IncompleteReadError (a failed shard, a 500) instead of StorageUnavailable (retried, 503)."""
    storage = _storage(tmp_path)
    storage.client, listener = _cutting_client(storage.bucket)
    try:
        with pytest.raises(StorageUnavailable, match="reading jobs/a/x.npy"):
            list(storage.iter_chunks("jobs/a/x.npy"))
        with pytest.raises(StorageUnavailable, match="reading"), storage.open("jobs/a/x.npy") as f:
            f.read()
    finally:
        listener.close()


def test_refused_credentials_name_the_credentials(s3_server: S3Server, tmp_path: Path) -> None:
    from botocore.exceptions import ClientError

    from services.storage.s3 import unavailable

    refused = ClientError({"Error": {"Code": "InvalidAccessKeyId", "Message": "no such key"}}, "HeadBucket")
    assert "check the credentials" in unavailable(refused, "studio", "head_bucket").detail


def test_removing_files_while_the_store_is_away_keeps_them_marked_present(db: str, s3_server: S3Server,
                                                                         tmp_path: Path) -> None:
    """Found from outside: DELETE .../files during an outage answered 500 yet marked the job's files removed; they
    stayed in the bucket for good (a second DELETE and retention skipped the marked job)."""
    storage = _storage(tmp_path)
    data = b"tiff" * 1000
    with session_scope() as session:
        create_station_token(session, "outage")
        station_id = session.query(Station.id).scalar()
        job = Job(id=uuid.uuid4().hex, station_id=station_id, status="done", camera="IQ3_S", recipe="tiff16",
                  priority="interactive", finished_at=utcnow(), params={})
        key = f"jobs/{job.id}/out/frame_00.tif"
        job.outputs = [Output(name="frame_00.tif", storage_key=key, sha256=hashlib.sha256(data).hexdigest(),
                              bytes=len(data))]
        session.add(job)
        job_id = job.id
    with storage.writer(key) as f:
        f.write(data)
    live = storage.client
    storage.client = _dead_client(storage.bucket)
    with session_scope() as session, pytest.raises(StorageUnavailable):
        discard(session, storage, session.get(Job, job_id))
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job.pruned_at is None and job.outputs[0].deleted_at is None
    storage.client = live
    assert storage.exists(key)
    with session_scope() as session:
        discard(session, storage, session.get(Job, job_id))
    assert not storage.exists(key)
    with session_scope() as session:
        assert session.get(Job, job_id).pruned_at is not None


@pytest.fixture
def client_without_bucket(db: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from api.app import create_app

    monkeypatch.setenv("STRATA_STORAGE_URL", f"s3://gone-{uuid.uuid4().hex[:8]}/studio")
    get_settings.cache_clear()
    get_storage.cache_clear()
    with TestClient(create_app()) as c:
        yield c
    get_settings.cache_clear()
    get_storage.cache_clear()


def test_the_api_answers_503_and_readiness_names_the_storage(client_without_bucket: TestClient,
                                                             synth_dir: Path) -> None:
    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'no-bucket')}"}
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    r = client_without_bucket.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", frame))])
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "storage_unavailable" and "does not exist" in r.json()["detail"]
    assert r.headers["retry-after"] == "5"
    ready = client_without_bucket.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["storage"].startswith("error: storage unavailable") and "does not exist" in ready.json()[
        "storage"]


def test_uploads_left_incomplete_are_aborted_by_the_retention_pass(s3_server: S3Server, tmp_path: Path) -> None:
    """Found from outside: uploads cut off mid-stream while the store was away stayed as incomplete multipart
    uploads (their abort failed too); the retention pass (and `strata storage prune`) aborts those a day old."""
    storage = _storage(tmp_path)
    raw = boto3.client("s3")
    upload = raw.create_multipart_upload(Bucket=storage.bucket, Key="studio/jobs/j/frames/00_big.dng")
    raw.create_multipart_upload(Bucket=storage.bucket, Key="elsewhere/x")  # outside this service's prefix
    assert storage.abort_stale_uploads(0) == 1  # (moto dates every upload 2010: the age is not tested here)
    left = raw.list_multipart_uploads(Bucket=storage.bucket).get("Uploads", [])
    assert [u["Key"] for u in left] == ["elsewhere/x"] and upload["UploadId"] not in {u["UploadId"] for u in left}
