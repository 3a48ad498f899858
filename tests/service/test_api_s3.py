"""The API on object storage (a moto server on loopback): uploads stream to the bucket and are probed by ranged
reads (nothing under the data folder), downloads stream or redirect to a pre-signed URL, a pruned output is 410."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from services.config import get_settings
from services.db.models import Job, Output, Station, utcnow
from services.db.session import session_scope
from services.stations import create_station_token
from services.storage import get_storage
from tests.conftest import S3Server


@pytest.fixture
def s3_client(db: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from api.app import create_app

    monkeypatch.setenv("STRATA_STORAGE_URL", f"s3://api-{uuid.uuid4().hex[:8]}/studio")
    monkeypatch.setenv("STRATA_S3_PART_MB", "5")
    monkeypatch.setenv("STRATA_S3_CREATE_BUCKET", "true")
    get_settings.cache_clear()
    get_storage.cache_clear()
    with TestClient(create_app()) as c:
        yield c
    get_settings.cache_clear()
    get_storage.cache_clear()


def _auth() -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {create_station_token(session, 'station-s3')}"}


def _disk_files() -> list[Path]:
    return [p for p in get_settings().data_dir.rglob("*") if p.is_file() and p.suffix != ".db"
            and "-wal" not in p.name and "-shm" not in p.name]


def test_upload_streams_to_the_bucket(s3_client: TestClient, synth_dir: Path) -> None:
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes() + b"\0" * (12 << 20)  # several 5 MiB parts
    auth = _auth()
    r = s3_client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", frame))])
    assert r.status_code == 202, r.text
    job = r.json()
    keys = dict(get_storage().list_sizes(f"jobs/{job['id']}"))
    assert keys == {f"jobs/{job['id']}/frames/00_a.dng": len(frame)}
    assert _disk_files() == []  # no copy on the API host, not even in its scratch cache
    bad = s3_client.post("/v1/jobs", headers=auth, files=[("frames", ("b.dng", b"not a raw" * 1000))])
    assert bad.status_code == 422 and bad.json()["type"] == "not_a_raw_file"
    assert len(list(get_storage().list_sizes("jobs"))) == 1  # the refused upload left nothing


def _finished_job(pruned: bool) -> tuple[str, bytes]:
    storage = get_storage()
    data = os.urandom(5000)
    with session_scope() as session:
        station_id = session.scalars(select(Station.id)).one()  # the station _auth created
        job = Job(id=uuid.uuid4().hex, station_id=station_id, status="done", camera="IQ3_S", recipe="tiff16",
                  priority="batch", finished_at=utcnow(), params={})
        key = f"jobs/{job.id}/out/frame_00.tif"
        job.outputs = [Output(name="frame_00.tif", storage_key=key, sha256=hashlib.sha256(data).hexdigest(),
                              bytes=len(data), deleted_at=utcnow() if pruned else None)]
        session.add(job)
        job_id = job.id
    with storage.writer(key) as f:
        f.write(data)
    return job_id, data


def test_downloads_stream_or_redirect(s3_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = _auth()
    job_id, data = _finished_job(pruned=False)
    url = f"/v1/jobs/{job_id}/outputs/frame_00.tif"
    assert s3_client.get(url, headers=auth).content == data
    part = s3_client.get(url, headers={**auth, "Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == data[10:20]
    monkeypatch.setenv("STRATA_S3_DOWNLOADS", "redirect")
    get_settings.cache_clear()
    moved = s3_client.get(url, headers=auth, follow_redirects=False)
    assert moved.status_code == 307
    signed = httpx.get(moved.headers["location"])
    assert signed.status_code == 200 and signed.content == data
    assert 'filename="frame_00.tif"' in signed.headers.get("content-disposition", "")


def test_a_pruned_output_is_gone(s3_client: TestClient) -> None:
    auth = _auth()
    job_id, _ = _finished_job(pruned=True)
    r = s3_client.get(f"/v1/jobs/{job_id}/outputs/frame_00.tif", headers=auth)
    assert r.status_code == 410 and r.json()["type"] == "gone"
