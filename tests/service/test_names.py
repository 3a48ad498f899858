"""Non-Latin file names: ASCII-safe stored names, the original kept, RFC 6266/5987 downloads (GET and HEAD)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from services.db.models import Job, Output, utcnow
from services.db.session import session_scope
from services.export.naming import NameTokens, render_name
from services.stations import create_station_token
from services.storage import get_storage
from services.storage.keys import output_key


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c


def _finish_with_output(job_id: str, data: bytes) -> str:
    """Record the job done with one TIFF named by the default template ``{stem}``, as finalize would."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job is not None
        tokens = NameTokens(station="s", camera="IQ3_S", capture_date="2026-01-01",
                            stem=Path(job.frames[0].name).stem, seq=1, job=job.id)
        name = render_name("{stem}", tokens, "tiff16", "tif")
        job.status = "done"
        job.outputs = [Output(name=name, storage_key=output_key(job.id, name), bytes=len(data),
                              sha256=hashlib.sha256(data).hexdigest())]
    with get_storage().writer(output_key(job_id, name)) as f:
        f.write(data)
    return name


@pytest.mark.parametrize("original", ["写真.dng", "写" * 100 + ".dng", "Été à Paris №1.dng"])
def test_non_latin_names_upload_and_download(client: TestClient, synth_dir: Path, original: str) -> None:
    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'station-a')}"}
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    r = client.post("/v1/jobs", headers=auth, files=[("frames", (original, frame))], data={"priority": "batch"})
    assert r.status_code == 202, r.text
    job = r.json()
    stored = job["frames"][0]
    assert stored["original_name"] == original
    assert stored["name"].isascii() and len(stored["name"].encode()) <= 120 and stored["name"].endswith(".dng")
    keys = [k for k, _ in get_storage().list_sizes(f"jobs/{job['id']}")]
    assert keys and all(k.isascii() and len(Path(k).name) < 200 for k in keys)

    name = _finish_with_output(job["id"], b"tiff bytes" * 100)
    assert name.isascii()
    url = f"/v1/jobs/{job['id']}/outputs/{name}"
    for method in ("GET", "HEAD"):
        got = client.request(method, url, headers=auth)
        assert got.status_code == 200, got.text
        disposition = got.headers["content-disposition"]
        assert disposition.startswith(f'attachment; filename="{name}"')
        assert disposition.isascii()
        offered = unquote(disposition.split("filename*=UTF-8''", 1)[1])
        assert offered == original.rsplit(".", 1)[0] + ".tif"
    assert client.get(url, headers=auth).content == b"tiff bytes" * 100


def test_plain_names_have_no_extended_filename(client: TestClient, synth_dir: Path) -> None:
    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'station-b')}"}
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    job = client.post("/v1/jobs", headers=auth, files=[("frames", ("shot.dng", frame))],
                      data={"priority": "batch"}).json()
    name = _finish_with_output(job["id"], b"x" * 10)
    got = client.head(f"/v1/jobs/{job['id']}/outputs/{name}", headers=auth)
    assert got.status_code == 200 and got.headers["content-disposition"] == 'attachment; filename="shot.tif"'


def test_a_download_streams_without_a_database_connection(client: TestClient, synth_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's session is closed when the route returns, before the body streams: 25 slow downloads of a
    35 MB TIFF once held 25 connections and every other request failed (500, "QueuePool limit ... reached")."""
    from services.db.session import get_engine
    from services.storage.local import LocalStorage

    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'station-c')}"}
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    job = client.post("/v1/jobs", headers=auth, files=[("frames", ("shot.dng", frame))],
                      data={"priority": "batch"}).json()
    name = _finish_with_output(job["id"], b"y" * (3 << 20))
    seen: list[int] = []
    chunks = LocalStorage.iter_chunks

    def counting(self: LocalStorage, *args: object, **kwargs: object) -> Iterator[bytes]:
        for i, chunk in enumerate(chunks(self, *args, **kwargs)):  # type: ignore[arg-type]
            if i == 1:  # (the first is read by the route, which opens the file before it returns)
                seen.append(get_engine().pool.checkedout())  # type: ignore[attr-defined]
            yield chunk

    monkeypatch.setattr(LocalStorage, "iter_chunks", counting)
    got = client.get(f"/v1/jobs/{job['id']}/outputs/{name}", headers=auth)
    assert got.status_code == 200 and len(got.content) == 3 << 20
    assert seen == [0]


def test_an_output_removed_during_its_download(client: TestClient, synth_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An output removed (DELETE .../files, retention) after the job was read: 410, not a 500 from the size lookup;
    removed once its download has begun: it still arrives whole (the file was opened before the response), not a
    response cut off after its headers (seen with a DELETE racing the download)."""
    import api.routes.jobs as routes

    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'station-d')}"}
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    job = client.post("/v1/jobs", headers=auth, files=[("frames", ("shot.dng", frame))],
                      data={"priority": "batch"}).json()
    data = bytes(range(256)) * (12 << 10)  # 3 MiB: three chunks
    name = _finish_with_output(job["id"], data)
    path = get_storage().local_path(output_key(job["id"], name))
    url = f"/v1/jobs/{job['id']}/outputs/{name}"
    real = routes._opened

    def opened_then_removed(chunks: Iterator[bytes], job_id: str, out: str) -> Iterator[bytes]:
        started = real(chunks, job_id, out)
        path.unlink()  # removed once the route holds the file open
        return started

    monkeypatch.setattr(routes, "_opened", opened_then_removed)
    got = client.get(url, headers=auth)
    assert got.status_code == 200 and got.content == data
    monkeypatch.undo()
    lost = client.get(url, headers=auth)  # the record still lists it, the file is gone, not removed by Strata
    assert lost.status_code == 404 and "missing from storage" in lost.json()["detail"]
    with session_scope() as session:  # as a DELETE of its files or retention marks it before removing
        session.execute(update(Job).where(Job.id == job["id"]).values(pruned_at=utcnow()))
    gone = client.get(url, headers=auth)
    assert gone.status_code == 410 and "was removed" in gone.json()["detail"]
