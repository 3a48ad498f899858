"""Roles, previews, the change feed, workers, tokens and /metrics through the real API (real database, real
Redis, real DNGs run through the real ingest and shards in-process)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from services.db.session import session_scope
from services.stations import create_station_token


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c


def _token(name: str, role: str = "station") -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {create_station_token(session, name, role=role)}"}


def _submit(client: TestClient, auth: dict[str, str], synth_dir: Path, name: str = "frame_00.dng") -> dict:
    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    r = client.post("/v1/jobs", headers=auth, files=[("frames", (name, data))])
    assert r.status_code == 202, r.text
    return r.json()


def _run(job_id: str) -> None:
    """The job through ingest, its shards and finalize, in this process (what the workers do)."""
    from services.config import get_settings
    from services.jobs import flow
    from services.jobs.previews import preview_ingested
    from services.storage import get_storage

    storage, settings = get_storage(), get_settings()
    with session_scope() as session:
        tickets = flow.ingest_job(session, storage, settings, job_id, n_workers=1)
    with session_scope() as session:  # as the ingest task does once the shards went out
        preview_ingested(session, storage, job_id)
    while tickets:
        for t in tickets:
            with session_scope() as session:
                flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="cpu", device="cpu")
        with session_scope() as session:
            tickets = flow.advance_job(session, storage, settings, job_id)


def test_a_token_in_the_query_string_is_refused(client: TestClient) -> None:
    auth = _token("station-a")
    token = auth["Authorization"].split()[1]
    for url in (f"/v1/jobs?token={token}", f"/v1/jobs?access_token={token}", f"/v1/jobs?x={token}",
                f"/healthz?token={token}", f"/dashboard?token={token}"):
        r = client.get(url)
        assert r.status_code == 401, url
        assert r.json()["type"] == "unauthorized" and "query string" in r.json()["detail"]
    assert client.get(f"/v1/jobs?token={token}", headers=auth).status_code == 401  # even with a good header


def test_admin_sees_every_station_and_stations_only_their_own(client: TestClient, synth_dir: Path) -> None:
    a, b, admin = _token("station-a"), _token("station-b"), _token("boss", "admin")
    ja, jb = _submit(client, a, synth_dir), _submit(client, b, synth_dir)
    assert ja["station"] == "station-a"
    for path in ("", "/preview", "/outputs/x.tif"):
        assert client.get(f"/v1/jobs/{jb['id']}{path}", headers=a).status_code == 404
    assert client.post(f"/v1/jobs/{jb['id']}/cancel", headers=a).status_code == 404
    assert [j["id"] for j in client.get("/v1/jobs", headers=a).json()["jobs"]] == [ja["id"]]
    assert [j["id"] for j in client.get("/v1/jobs/changes", headers=a).json()["jobs"]] == [ja["id"]]
    assert [j["id"] for j in client.get("/v1/jobs?station=station-b", headers=a).json()["jobs"]] == [ja["id"]]
    assert {j["id"] for j in client.get("/v1/jobs", headers=admin).json()["jobs"]} == {ja["id"], jb["id"]}
    assert [j["id"] for j in client.get("/v1/jobs?station=station-b", headers=admin).json()["jobs"]] == [jb["id"]]
    assert client.get("/v1/jobs?station=nobody", headers=admin).status_code == 404
    assert client.get(f"/v1/jobs/{jb['id']}", headers=admin).json()["station"] == "station-b"
    assert client.post(f"/v1/jobs/{jb['id']}/cancel", headers=admin).json()["status"] == "cancelled"
    for method, path in (("GET", "/v1/tokens"), ("POST", "/v1/tokens"), ("DELETE", "/v1/tokens/station-b")):
        assert client.request(method, path, headers=a, json={"name": "x"}).status_code == 403
    assert client.get("/v1/workers", headers=a).status_code == 200
    assert client.get("/v1/me", headers=admin).json()["role"] == "admin"


def test_search_and_the_change_feed(client: TestClient, synth_dir: Path) -> None:
    a = _token("station-a")
    one = _submit(client, a, synth_dir, "Portrait_001.dng")
    _submit(client, a, synth_dir, "still_life.dng")
    assert [j["id"] for j in client.get("/v1/jobs?q=portrait", headers=a).json()["jobs"]] == [one["id"]]
    # found from outside: a name starting strata_ was refused as a token in the URL, a backslash matched nothing
    named = _submit(client, a, synth_dir, "strata_0001.dng")
    assert [j["id"] for j in client.get("/v1/jobs?q=strata_0001", headers=a).json()["jobs"]] == [named["id"]]
    from sqlalchemy import update

    from services.db.models import Frame

    with session_scope() as session:  # the name a Windows station sent
        session.execute(update(Frame).where(Frame.job_id == named["id"]).values(
            original_name="D:\\shoot\\strata_0001.dng"))
        session.commit()
    assert [j["id"] for j in client.get("/v1/jobs", headers=a, params={"q": "shoot\\strata"}).json()["jobs"]] == [
        named["id"]]
    assert client.get("/v1/jobs", headers=a, params={"q": "shoot\\\\strata"}).json()["jobs"] == []
    client.post(f"/v1/jobs/{named['id']}/cancel", headers=a)
    for query in ("status=queued&status=cancelled", "status=queued,cancelled"):  # several statuses (was: the last)
        assert len(client.get(f"/v1/jobs?{query}", headers=a).json()["jobs"]) == 3
    assert [j["id"] for j in client.get("/v1/jobs?status=cancelled", headers=a).json()["jobs"]] == [named["id"]]
    assert client.get("/v1/jobs?status=done,nope", headers=a).status_code == 422
    first = client.get("/v1/jobs/changes", headers=a).json()
    assert len(first["jobs"]) == 3
    client.post(f"/v1/jobs/{one['id']}/cancel", headers=a)
    later = client.get("/v1/jobs/changes", headers=a, params={"since": first["cursor"]}).json()
    assert one["id"] in [j["id"] for j in later["jobs"] if j["status"] == "cancelled"]
    assert client.get("/v1/jobs/changes?since=yesterday", headers=a).status_code == 422
    assert client.get("/v1/jobs/changes?since=0001-01-01T00:00:00", headers=a).status_code == 200  # was a 500


def test_changes_past_the_limit_are_delivered_on_the_next_polls(client: TestClient, synth_dir: Path) -> None:
    """Found from outside: an answer cut at ``limit`` returned "now" as its cursor, so the changes past it (a night
    batch cancelled at once: one statement, one timestamp) were never delivered."""
    import datetime as dt

    from sqlalchemy import update

    from services.db.models import Job

    a = _token("station-c")
    ids = {_submit(client, a, synth_dir, f"s{i}.dng")["id"] for i in range(5)}
    cursor = client.get("/v1/jobs/changes", headers=a, params={"limit": 1}).json()["cursor"]
    same = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    with session_scope() as session:  # what a bulk cancel does: every row one updated_at
        session.execute(update(Job).where(Job.id.in_(ids)).values(updated_at=same))
        session.commit()
    seen: list[str] = []
    for _ in range(6):
        page = client.get("/v1/jobs/changes", headers=a, params={"since": cursor, "limit": 2}).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["cursor"]
        if len(page["jobs"]) < 2:
            break
    assert set(seen) == ids and len(seen) == len(ids)  # each once, and the polls came to an end
    # A cursor written with another offset means the same instant (SQLite compared its text: 18 jobs instead of 8).
    utc = client.get("/v1/jobs/changes", headers=a, params={"since": "2020-01-01T10:00:00+00:00"}).json()["jobs"]
    other = client.get("/v1/jobs/changes", headers=a, params={"since": "2020-01-01T11:00:00+01:00"}).json()["jobs"]
    assert len(utc) == len(other) == 5


def test_a_job_cancelled_while_its_outputs_are_written_gets_none(client: TestClient, synth_dir: Path,
                                                               monkeypatch) -> None:
    """Found from outside: cancelled during ``encoding``, a job read ``cancelled`` yet listed (and served) every
    output, and kept its final preview and files."""
    from services.jobs import finalize
    from services.storage import get_storage

    a = _token("station-d")
    job = _submit(client, a, synth_dir)
    written = finalize.write_outputs
    keys: list[str] = []

    def write_then_cancel(*args, **kwargs):  # type: ignore[no-untyped-def]
        outs = written(*args, **kwargs)
        keys.extend(o.storage_key for o in outs)
        assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=a).status_code == 200
        return outs

    monkeypatch.setattr(finalize, "write_outputs", write_then_cancel)
    _run(job["id"])
    got = client.get(f"/v1/jobs/{job['id']}", headers=a).json()
    assert got["status"] == "cancelled" and got["outputs"] == [] and got["preview_kind"] != "final"
    assert keys and not any(get_storage().exists(k) for k in keys)


def test_tokens_over_the_api(client: TestClient) -> None:
    admin = _token("boss", "admin")
    made = client.post("/v1/tokens", headers=admin, json={"name": "studio-2"})
    assert made.status_code == 201 and made.json()["role"] == "station"
    new = {"Authorization": f"Bearer {made.json()['token']}"}
    assert client.get("/v1/jobs", headers=new).status_code == 200
    assert client.post("/v1/tokens", headers=admin, json={"name": "studio-2"}).status_code == 409
    names = {t["name"]: t for t in client.get("/v1/tokens", headers=admin).json()}
    assert names["boss"]["role"] == "admin" and "token" not in names["studio-2"]
    assert client.delete("/v1/tokens/studio-2", headers=admin).status_code == 204
    assert client.get("/v1/jobs", headers=new).status_code == 401
    assert client.delete("/v1/tokens/studio-2", headers=admin).status_code == 404


def test_preview_fast_then_final_with_etag(client: TestClient, synth_dir: Path) -> None:
    a = _token("station-a")
    job = _submit(client, a, synth_dir)
    assert job["render"] is None  # not decided before ingest
    r = client.get(f"/v1/jobs/{job['id']}/preview", headers=a)
    assert r.status_code == 404 and r.json()["type"] == "not_found"
    from services.config import get_settings
    from services.jobs import flow
    from services.jobs.previews import preview_ingested
    from services.storage import get_storage

    with session_scope() as session:
        tickets = flow.ingest_job(session, get_storage(), get_settings(), job["id"], n_workers=1)
    from services.jobs import previews

    assert job["id"] in previews._PENDING  # begun when the decode binned frame 0 (an uncompressed DNG)
    with session_scope() as session:  # as the ingest task does once the shards went out
        preview_ingested(session, get_storage(), job["id"])
    assert tickets and job["id"] not in previews._PENDING
    fast = client.get(f"/v1/jobs/{job['id']}/preview", headers=a)
    # The same preview, byte for byte, when it has to bin the stored mosaic (LibRaw decoded it, another process)
    from sqlalchemy import update

    from services.db.models import Job

    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(preview_etag=None))
        session.commit()
        preview_ingested(session, get_storage(), job["id"])
    assert client.get(f"/v1/jobs/{job['id']}/preview", headers=a).content == fast.content
    assert fast.status_code == 200 and fast.headers["content-type"] == "image/jpeg"
    assert "max-age" in fast.headers["cache-control"]
    for path in ("", "/preview"):  # HEAD answers the headers (was 405)
        head = client.head(f"/v1/jobs/{job['id']}{path}", headers=a)
        assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] != "0"
    image = Image.open(io.BytesIO(fast.content))
    assert image.format == "JPEG" and image.mode == "RGB" and max(image.size) <= 1600
    assert client.get(f"/v1/jobs/{job['id']}", headers=a).json()["preview_kind"] == "fast"
    again = client.get(f"/v1/jobs/{job['id']}/preview", headers={**a, "If-None-Match": fast.headers["etag"]})
    assert again.status_code == 304 and again.headers["etag"] == fast.headers["etag"]
    assert client.get(f"/v1/jobs/{job['id']}/preview", headers={**a, "If-None-Match": "*"}).status_code == 304
    _run(job["id"])
    done = client.get(f"/v1/jobs/{job['id']}", headers=a).json()
    assert done["status"] == "done" and done["preview_kind"] == "final"
    assert {"decode_s", "prepare_s", "phase_0_s", "encode_s", "finalize_wait_s",
            "finalize_read_s"} <= set(done["timings"])  # stage timings
    assert all(v >= 0 for v in done["timings"].values())
    render = done["render"]  # how it was rendered, decided at ingest
    assert render["frames"] == 1 and render["frames_package"] is None and render["noise_shot"] >= 0
    clean = render["snr_db"] is None or render["snr_db"] >= 24.0
    assert render["orientations"] == (2 if clean and render["package"] == "strata_jdd_v2.strata" else 1), render
    final = client.get(f"/v1/jobs/{job['id']}/preview", headers={**a, "If-None-Match": fast.headers["etag"]})
    assert final.status_code == 200 and final.headers["etag"] != fast.headers["etag"]
    big = Image.open(io.BytesIO(final.content)).size  # a small frame: the fast one is at half resolution
    assert max(big) <= 1600 and abs(big[0] / big[1] - image.size[0] / image.size[1]) < 0.02


@pytest.mark.one_backend
def test_a_portrait_shots_previews_carry_its_orientation(client: TestClient, synth_dir: Path) -> None:
    """A shot the camera recorded as turned (EXIF Orientation 6, rotate 90 CW) gets fast and final previews that say
    so, as its proofs and TIFFs do, so the dashboard shows it upright; a plain shot's previews carry no EXIF."""
    import tifffile

    data = bytearray((synth_dir / "iq3s" / "frame_00.dng").read_bytes())
    with tifffile.TiffFile(io.BytesIO(bytes(data))) as tif:
        at = tif.pages.first.tags[274].valueoffset
    data[at : at + 2] = (6).to_bytes(2, "little" if data[:2] == b"II" else "big")
    a = _token("station-a")
    r = client.post("/v1/jobs", headers=a, files=[("frames", ("portrait.dng", bytes(data)))])
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    from services.config import get_settings
    from services.jobs import flow
    from services.jobs.previews import preview_ingested
    from services.storage import get_storage

    with session_scope() as session:
        flow.ingest_job(session, get_storage(), get_settings(), job_id, n_workers=1)
    with session_scope() as session:
        preview_ingested(session, get_storage(), job_id)
    fast = Image.open(io.BytesIO(client.get(f"/v1/jobs/{job_id}/preview", headers=a).content))
    assert fast.getexif().get(274) == 6
    _run(job_id)
    final = client.get(f"/v1/jobs/{job_id}/preview", headers=a)
    assert client.get(f"/v1/jobs/{job_id}", headers=a).json()["preview_kind"] == "final"
    assert Image.open(io.BytesIO(final.content)).getexif().get(274) == 6
    plain = _submit(client, a, synth_dir, "plain.dng")
    _run(plain["id"])
    assert 274 not in Image.open(io.BytesIO(client.get(f"/v1/jobs/{plain['id']}/preview", headers=a).content)).getexif()


def test_preview_of_a_job_failed_at_decode_is_404(client: TestClient, synth_dir: Path) -> None:
    """The upload passes the probe, then its stored bytes are cut (a disk fault): ingest fails at decode."""
    from services.config import get_settings
    from services.db.models import Frame
    from services.jobs import flow
    from services.storage import get_storage

    a = _token("station-a")
    job = _submit(client, a, synth_dir)
    with session_scope() as session:
        frame = session.query(Frame).filter_by(job_id=job["id"]).one()
        path = get_storage().local_path(frame.storage_key)
    path.write_bytes(path.read_bytes()[:4096])
    with session_scope() as session:
        assert flow.ingest_job(session, get_storage(), get_settings(), job["id"], n_workers=1) == []
    failed = client.get(f"/v1/jobs/{job['id']}", headers=a).json()
    assert failed["status"] == "failed" and failed["error"].startswith("decode failed")
    assert failed["preview_url"] is None
    r = client.get(f"/v1/jobs/{job['id']}/preview", headers=a)
    assert r.status_code == 404 and set(r.json()) == {"type", "detail"} and r.json()["type"] == "not_found"
    assert "strata_decode_failed_jobs 1.0" in client.get("/metrics").text


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name:
                total += float(value)
    return total


def test_metrics_after_a_job(client: TestClient, synth_dir: Path) -> None:
    a = _token("station-a")
    before = client.get("/metrics").text
    job = _submit(client, a, synth_dir)
    _run(job["id"])
    text = client.get("/metrics").text
    assert _metric(text, "strata_jobs", status="done") == 1
    assert _metric(text, "strata_bytes_uploaded_total") - _metric(before, "strata_bytes_uploaded_total") == \
        job["frames"][0]["bytes"]
    assert _metric(text, "strata_bytes_written_total") > _metric(before, "strata_bytes_written_total")
    assert _metric(text, "strata_preview_seconds_count", kind="fast") > _metric(
        before, "strata_preview_seconds_count", kind="fast")
    assert _metric(text, "strata_preview_seconds_count", kind="final") >= 1
    assert "strata_queue_depth" in text and "strata_decode_failed_jobs" in text


def test_workers_show_heartbeats_with_the_current_shard(client: TestClient, redis_url: str) -> None:
    from workers.registry import Heartbeat, WorkerInfo

    info = WorkerInfo(name="gpu7@test-host", kind="gpu", gpu="7", device="cuda:0", queue="gpu.gpu7@test-host",
                      host="test-host", pid=1)
    beat = Heartbeat(redis_url, info, 5, memory_mb=lambda: 1234.5)
    beat.start()
    try:
        beat.add_shard(42)
        body = client.get("/v1/workers", headers=_token("boss", "admin")).json()
        mine = next(w for w in body["workers"] if w["name"] == "gpu7@test-host")
        assert mine["busy"] and mine["current_shard"] == 42 and mine["memory_mb"] == 1234.5
        assert mine["last_heartbeat"] and {"coordinator", "gpu"} <= set(body["queues"])
        assert set(body["queues"]["gpu"]) == {"interactive", "batch"}
        station = client.get("/v1/workers", headers=_token("station-a")).json()  # busy, not with what
        seen = next(w for w in station["workers"] if w["name"] == "gpu7@test-host")
        assert seen["busy"] and seen["current_shard"] is None and seen["shards"] == [] and seen["jobs"] == []
    finally:
        beat.stop()


def test_token_commands(tmp_path: Path) -> None:
    import subprocess
    import sys

    def strata(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "token", *args, "--data-dir", str(tmp_path)],
                              capture_output=True, text=True, env={**__import__("os").environ,
                                                                   "STRATA_DATABASE_URL": ""})

    made = strata("create", "--admin", "--name", "boss")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().splitlines()[-1].startswith("strata_")
    assert strata("create", "--station", "studio-a").returncode == 0
    listed = strata("list").stdout
    assert "boss\tadmin" in listed and "studio-a\tstation" in listed
    assert strata("revoke", "studio-a").returncode == 0
    assert "studio-a\tstation" in strata("list").stdout and "revoked" in strata("list").stdout
    assert strata("revoke", "nobody").returncode != 0
    # found from outside: bad usage exited 1, as a failed job does (README: 2 is bad usage)
    assert strata("create").returncode == 2 and strata("create", "--station", "a/b").returncode == 2
    assert strata("create", "--station", "boss").returncode == 1  # a live principal's name: refused, not misused


@pytest.mark.one_backend
def test_a_non_srgb_render_keeps_its_srgb_fast_preview(client: TestClient, synth_dir: Path) -> None:
    a = _token("station-a")
    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    r = client.post("/v1/jobs", headers=a, files=[("frames", ("wide.dng", data))], data={"recipe": "tiff16-prophoto"})
    assert r.status_code == 202, r.text
    _run(r.json()["id"])
    job = client.get(f"/v1/jobs/{r.json()['id']}", headers=a).json()
    assert job["status"] == "done" and job["preview_kind"] == "fast"


@pytest.mark.parametrize(("mode", "interactive", "batch"), [("batch", False, True), ("on", True, True),
                                                           ("off", False, False)])
def test_gpu_tiles_are_planned_for_the_lanes_the_setting_names(client: TestClient, synth_dir: Path, mode: str,
                                                               interactive: bool, batch: bool) -> None:
    """STRATA_GPU_DEFLATE=on (the default): every job gets its TIFF tiles planned for the GPU workers; batch: only
    batch-lane jobs (an interactive shot keeps the CPU's deflate); off: none."""
    from services.config import get_settings
    from services.jobs import flow
    from services.jobs.plan import JobPlan
    from services.storage import get_storage

    a = _token("station-a")
    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    settings = get_settings().model_copy(update={"gpu_deflate": mode})
    planned = {}
    for priority in ("interactive", "batch"):
        r = client.post("/v1/jobs", headers=a, files=[("frames", ("f.dng", data))], data={"priority": priority})
        assert r.status_code == 202, r.text
        with session_scope() as session:
            flow.ingest_job(session, get_storage(), settings, r.json()["id"], n_workers=1)
        with session_scope() as session:
            from services.db.models import Job

            planned[priority] = bool(JobPlan.from_params(session.get(Job, r.json()["id"]).params).tile_spaces)
    assert planned == {"interactive": interactive, "batch": batch}
