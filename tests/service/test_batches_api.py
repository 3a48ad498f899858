"""Batches through the REST API against a real database (SQLite and PostgreSQL), and the admission pass."""

from __future__ import annotations

import csv
import datetime as dt
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from services.batches.admission import admission_pass, in_flight
from services.config import get_settings
from services.db.models import Batch, Job, as_utc, utcnow
from services.db.session import session_scope
from services.stations import create_station_token


@pytest.fixture
def import_root(tmp_path: Path, synth_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "import"
    night = root / "night"
    night.mkdir(parents=True)
    for i in range(3):
        shutil.copy(synth_dir / "iq3s" / "frame_00.dng", night / f"shot_{i:02d}.dng")
    (night / "notes.txt").write_text("not a raw")
    (root / "empty").mkdir()
    (root / "empty" / "readme.txt").write_text("nothing")
    monkeypatch.setenv("STRATA_IMPORT_ROOT", str(root))
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c


def _token(name: str) -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {create_station_token(session, name)}"}


@pytest.fixture
def auth(client: TestClient) -> dict[str, str]:
    return _token("station-a")


def _create(client: TestClient, auth: dict[str, str], **body: object) -> dict:
    r = client.post("/v1/batches", headers=auth, json={"name": "night", **body})
    assert r.status_code == 201, r.text
    return r.json()


def test_batch_from_paths_queues_one_job_per_raw_file(client: TestClient, auth: dict[str, str],
                                                      import_root: Path) -> None:
    batch = _create(client, auth, paths=["night"], recipes=["tiff16-adobergb"], webhook_url="https://h.example/x")
    assert batch["status"] == "open" and batch["total"] == 3 and batch["priority"] == "batch"
    assert batch["counts"]["queued"] == 3 and batch["recipes"] == ["tiff16-adobergb"]
    assert len(batch["webhook_secret"]) == 64
    got = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    assert got["webhook_secret"] is None and got["counts"] == batch["counts"] and got["eta"] is None
    jobs = client.get("/v1/jobs", headers=auth).json()["jobs"]
    assert len(jobs) == 3 and {j["recipe"] for j in jobs} == {"tiff16-adobergb"}
    assert sorted(j["frames"][0]["name"] for j in jobs) == ["shot_00.dng", "shot_01.dng", "shot_02.dng"]
    # the path under the import root (found from outside: same-named files of two folders could not be told apart)
    assert sorted(j["frames"][0]["original_name"] for j in jobs) == ["night/shot_00.dng", "night/shot_01.dng",
                                                                      "night/shot_02.dng"]
    report = client.get(f"/v1/batches/{batch['id']}/report", headers=auth).json()
    assert sorted(s["name"] for s in report["shots"]) == ["night/shot_00.dng", "night/shot_01.dng",
                                                          "night/shot_02.dng"]
    with session_scope() as session:  # waiting for admission: nothing was sent
        assert all(j.admitted_at is None and j.batch_id == batch["id"] for j in session.query(Job))


def test_window_in_studio_time_and_scheduled_status(client: TestClient, auth: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_TIMEZONE", "America/New_York")
    get_settings.cache_clear()
    batch = _create(client, auth, not_before="2099-07-01T19:00", not_after="2099-07-02T07:00+00:00",
                    on_window_end="skip")
    assert batch["status"] == "scheduled" and batch["total"] == 0
    assert dt.datetime.fromisoformat(batch["not_before"]) == dt.datetime(2099, 7, 1, 23, tzinfo=dt.UTC)
    assert batch["on_window_end"] == "skip"
    get_settings.cache_clear()


@pytest.mark.parametrize("body, match", [
    ({"recipes": ["tiff99"]}, "unknown recipe"),
    ({"not_before": "2026-12-02T07:00", "not_after": "2026-12-01T19:00"}, "before it starts"),
    ({"not_before": "tonight"}, "ISO 8601"),
    ({"paths": ["../outside"]}, "outside the import root"),
    ({"paths": ["/etc"]}, "outside the import root"),
    ({"paths": ["empty"]}, "zero shots"),
    ({"webhook_url": "ftp://h.example/x"}, "http"),
    ({"webhook_url": "http://169.254.169.254/latest/meta-data"}, "link-local"),  # a cloud's metadata service
    ({"priority": "urgent"}, "priority"),
    ({"on_window_end": "maybe"}, "on_window_end"),
    ({"name": ""}, "name"),
    # found from outside: a 500 (OverflowError), and batches created in a state no shot could run in
    ({"not_before": "9999-12-31T23:30:00-01:00"}, "outside the years"),
    ({"not_after": "0001-01-01T00:30:00+01:00"}, "outside the years"),
    ({"recipes": ["tiff16", "tiff8", "jpeg", "png16", "jpeg-proof", "tiff16-fast", "tiff16-max", "tiff16-zstd",
                  "tiff16-linear"]}, "at most 8 per job"),
    ({"not_after": "2020-01-01T00:00:00Z", "on_window_end": "skip"}, "no shot of this batch could run"),
    # found from outside: a misspelt field was ignored, so a window meant for tonight opened at once
    ({"not_befor": "2030-01-01T19:00"}, "body.not_befor: Extra inputs are not permitted"),
    ({"recipe": ["tiff8"]}, "body.recipe"),
])
def test_bad_batches_are_422(client: TestClient, auth: dict[str, str], import_root: Path, body: dict,
                             match: str) -> None:
    r = client.post("/v1/batches", headers=auth, json={"name": "night", **body})
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"type", "detail"} and match in r.json()["detail"]
    assert client.get("/v1/batches", headers=auth).json()["batches"] == []
    assert client.get("/v1/jobs", headers=auth).json()["jobs"] == []


def test_paths_are_refused_without_an_import_root(client: TestClient, auth: dict[str, str]) -> None:
    r = client.post("/v1/batches", headers=auth, json={"name": "night", "paths": ["night"]})
    assert r.status_code == 422 and "no import root" in r.json()["detail"]


def test_uploaded_shots_join_the_batch_with_its_recipe(client: TestClient, auth: dict[str, str],
                                                       synth_dir: Path) -> None:
    batch = _create(client, auth, recipes=["tiff16-prophoto"])
    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    r = client.post(f"/v1/batches/{batch['id']}/shots", headers=auth, files=[("frames", ("a.dng", data))])
    assert r.status_code == 202, r.text
    assert r.json()["recipe"] == "tiff16-prophoto" and r.json()["priority"] == "batch"
    r2 = client.post(f"/v1/batches/{batch['id']}/shots", headers=auth, files=[("frames", ("b.dng", data))],
                     data={"recipe": "tiff16"})
    assert r2.json()["recipe"] == "tiff16"
    bad = client.post(f"/v1/batches/{batch['id']}/shots", headers=auth, files=[("frames", ("c.dng", b"nope"))])
    assert bad.status_code == 422 and bad.json()["type"] == "not_a_raw_file"
    assert client.get(f"/v1/batches/{batch['id']}", headers=auth).json()["total"] == 2
    other = _token("station-b")
    assert client.post(f"/v1/batches/{batch['id']}/shots", headers=other,
                       files=[("frames", ("a.dng", data))]).status_code == 404


def test_list_is_per_station_newest_first_and_paged(client: TestClient, auth: dict[str, str]) -> None:
    ids = [_create(client, auth, name=f"n{i}")["id"] for i in range(3)]
    _create(client, _token("station-b"))
    page = client.get("/v1/batches?limit=2", headers=auth).json()
    assert [b["id"] for b in page["batches"]] == ids[::-1][:2] and page["next_cursor"]
    rest = client.get(f"/v1/batches?limit=2&cursor={page['next_cursor']}", headers=auth).json()
    assert [b["id"] for b in rest["batches"]] == [ids[0]] and rest["next_cursor"] is None
    assert client.get("/v1/batches/nope", headers=auth).status_code == 404


def _finish(job_id: str, status: str, error: str | None = None) -> None:
    with session_scope() as session:
        now = utcnow()
        session.execute(update(Job).where(Job.id == job_id).values(
            status=status, error=error, started_at=now - dt.timedelta(seconds=30), finished_at=now))


def test_admission_limits_the_lane_then_ends_the_batch(client: TestClient, auth: dict[str, str],
                                                       import_root: Path) -> None:
    batch = _create(client, auth, paths=["night"])
    settings = get_settings()
    with session_scope() as session:
        first = admission_pass(session, settings, capacity=2)
        assert len(first.ingest) == 2 and in_flight(session) == 2
        assert admission_pass(session, settings, capacity=2).ingest == []  # full: nothing more
        assert session.get(Batch, batch["id"]).status == "running"
    _finish(first.ingest[0][0], "done")
    with session_scope() as session:
        second = admission_pass(session, settings, capacity=2)
        assert len(second.ingest) == 1 and second.finished == []
    _finish(first.ingest[1][0], "failed", "decode failed: boom")
    _finish(second.ingest[0][0], "done")
    with session_scope() as session:
        assert admission_pass(session, settings, capacity=2).finished == [batch["id"]]
        assert admission_pass(session, settings, capacity=2).finished == []  # reported once
    got = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    assert got["status"] == "done" and got["counts"]["done"] == 2 and got["counts"]["failed"] == 1
    assert got["finished_at"] and got["shots_per_minute"] is not None


def test_an_unsealed_batch_renders_its_shots_but_ends_only_once_sealed(client: TestClient, auth: dict[str, str],
                                                                      synth_dir: Path) -> None:
    """Found from outside: `strata batch create NAME DIR` over a slow link rendered the first shots before the next
    upload came, the batch ended, and the rest were refused (409). A batch created ``sealed: false`` renders its
    shots as they come and ends only once sealed; the seal is its station's (or an admin's)."""
    batch = _create(client, auth, sealed=False)
    assert batch["sealed"] is False and batch["status"] == "open"
    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    first = client.post(f"/v1/batches/{batch['id']}/shots", headers=auth, files=[("frames", ("a.dng", data))]).json()
    settings = get_settings()
    with session_scope() as session:
        assert [j for j, _ in admission_pass(session, settings, capacity=2).ingest] == [first["id"]]
    _finish(first["id"], "done")
    with session_scope() as session:
        assert admission_pass(session, settings, capacity=2).finished == []  # more shots are coming
    second = client.post(f"/v1/batches/{batch['id']}/shots", headers=auth, files=[("frames", ("b.dng", data))])
    assert second.status_code == 202, second.text
    assert client.post(f"/v1/batches/{batch['id']}/seal", headers=_token("station-b")).status_code == 404
    sealed = client.post(f"/v1/batches/{batch['id']}/seal", headers=auth)
    assert sealed.status_code == 200 and sealed.json()["sealed"] is True and sealed.json()["total"] == 2
    with session_scope() as session:
        admission_pass(session, settings, capacity=2)
    _finish(second.json()["id"], "done")
    with session_scope() as session:
        assert admission_pass(session, settings, capacity=2).finished == [batch["id"]]
    done = client.post(f"/v1/batches/{batch['id']}/seal", headers=auth).json()  # sealing again: no change
    assert done["status"] == "done" and done["counts"]["done"] == 2
    assert _create(client, auth)["sealed"] is True  # the default: sealed, ends when its shots are over
    empty = _create(client, auth, sealed=False)  # sealed before any shot came: nothing will, it ends now
    gone = client.post(f"/v1/batches/{empty['id']}/seal", headers=auth).json()
    assert gone["status"] == "cancelled" and gone["total"] == 0 and gone["finished_at"]


def test_closed_window_admits_nothing_and_skip_reports_not_run(client: TestClient, auth: dict[str, str],
                                                               import_root: Path) -> None:
    now = utcnow()
    later = _create(client, auth, paths=["night/shot_00.dng"], not_before=(now + dt.timedelta(hours=1)).isoformat())
    with session_scope() as session:
        assert admission_pass(session, get_settings(), capacity=5).ingest == []
        assert admission_pass(session, get_settings(), capacity=5,
                              now=now + dt.timedelta(hours=1, seconds=1)).ingest != []
    skipped = _create(client, auth, paths=["night/shot_01.dng"], not_before=now.isoformat(),
                      not_after=(now + dt.timedelta(minutes=1)).isoformat(), on_window_end="skip")
    waiting = _create(client, auth, paths=["night/shot_02.dng"], not_before=(now - dt.timedelta(hours=2)).isoformat(),
                      not_after=(now - dt.timedelta(hours=1)).isoformat(), on_window_end="wait")
    with session_scope() as session:
        result = admission_pass(session, get_settings(), capacity=5, now=now + dt.timedelta(minutes=2))
        assert result.ingest == [] and result.finished == [skipped["id"]]
        moved = session.get(Batch, waiting["id"])
        assert moved.status == "scheduled"  # wait: the same clock times tomorrow
        assert as_utc(moved.not_before) - (now - dt.timedelta(hours=2)) == dt.timedelta(days=1)
    report = client.get(f"/v1/batches/{skipped['id']}/report", headers=auth).json()
    assert report["batch"]["status"] == "failed" and report["batch"]["counts"]["not_run"] == 1
    assert report["shots"][0]["status"] == "not_run" and report["shots"][0]["error"].startswith("not run:")
    assert later["status"] == "scheduled"


def test_report_json_and_csv_list_every_shot(client: TestClient, auth: dict[str, str], import_root: Path) -> None:
    batch = _create(client, auth, paths=["night"])
    jobs = client.get("/v1/jobs", headers=auth).json()["jobs"]
    _finish(jobs[0]["id"], "failed", "decode failed: boom")
    report = client.get(f"/v1/batches/{batch['id']}/report", headers=auth).json()
    assert report["batch"]["id"] == batch["id"] and len(report["shots"]) == 3
    assert {s["status"] for s in report["shots"]} == {"queued", "failed"}
    failed = next(s for s in report["shots"] if s["status"] == "failed")
    assert failed["error"] == "decode failed: boom" and failed["seconds"] == 30.0 and failed["outputs"] == []
    r = client.get(f"/v1/batches/{batch['id']}/report?format=csv", headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 3 and list(rows[0]) == ["job", "name", "status", "outputs", "urls", "sha256", "bytes",
                                                 "error", "queued_at", "started_at", "finished_at", "seconds"]
    assert client.get(f"/v1/batches/{batch['id']}/report?format=xml", headers=auth).status_code == 422


def test_list_counts_every_batch_in_one_query(client: TestClient, auth: dict[str, str], import_root: Path) -> None:
    """The list counts shots in the database, not by loading every shot of every batch (found from outside: three
    queries a batch, 0.85 s for a dashboard poll with three 1,000-shot nights), and says what each batch's own
    page says."""
    from sqlalchemy import event

    from services.db.session import get_engine

    first = _create(client, auth, paths=["night"])
    statements: list[str] = []
    event.listen(get_engine(), "before_cursor_execute", lambda *args: statements.append(args[2]))
    assert client.get("/v1/batches", headers=auth).status_code == 200
    one_batch = len(statements)
    night = _create(client, auth, paths=["night"])
    _create(client, auth, name="empty", sealed=False)
    jobs = client.get(f"/v1/batches/{night['id']}/report", headers=auth).json()["shots"]
    _finish(jobs[0]["job"], "done")
    _finish(jobs[1]["job"], "cancelled", "not run: the batch window ended")
    _finish(jobs[2]["job"], "cancelled", "Not run: by hand")  # only the window's own prefix is not_run
    with session_scope() as session:
        session.execute(update(Batch).where(Batch.id == night["id"]).values(
            started_at=utcnow() - dt.timedelta(minutes=2)))
    statements.clear()
    listed = client.get("/v1/batches", headers=auth).json()["batches"]
    assert len(statements) == one_batch  # however many batches and shots
    by_name = {b["name"]: b for b in listed}
    assert by_name["empty"]["total"] == 0 and set(by_name["empty"]["counts"].values()) == {0}
    assert by_name["night"]["total"] == 3
    got = next(b for b in listed if b["id"] == night["id"])
    assert {k: v for k, v in got["counts"].items() if v} == {"done": 1, "cancelled": 1, "not_run": 1}
    assert got["shots_per_minute"] == pytest.approx(0.5, rel=0.01)  # one shot in the 2 minutes since the start
    for batch in listed:
        alone = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
        assert {k: alone[k] for k in ("counts", "total", "shots_per_minute")} == {
            k: batch[k] for k in ("counts", "total", "shots_per_minute")}
    assert next(b for b in listed if b["id"] == first["id"])["counts"]["queued"] == 3


def test_cancel_cancels_the_batch_and_its_shots(client: TestClient, auth: dict[str, str], import_root: Path) -> None:
    batch = _create(client, auth, paths=["night"])
    r = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["counts"]["cancelled"] == 3
    again = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth)
    assert again.status_code == 409 and again.json()["type"] == "conflict"
    assert client.post(f"/v1/batches/{batch['id']}/shots", headers=auth,
                       files=[("frames", ("a.dng", b"x"))]).status_code == 409


def test_admission_is_fair_between_stations(client: TestClient, auth: dict[str, str], import_root: Path,
                                            synth_dir: Path) -> None:
    """Station A queues its three shots first; station B's one shot is still admitted second, not last."""
    big = _create(client, auth, paths=["night"])
    other = _token("station-b")
    small = _create(client, other, name="b")
    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    b_job = client.post(f"/v1/batches/{small['id']}/shots", headers=other,
                        files=[("frames", ("b.dng", data))]).json()["id"]
    order = []
    with session_scope() as session:
        for _ in range(4):  # one slot at a time: each admitted job ends before the next pass
            admitted = admission_pass(session, get_settings(), capacity=1).ingest
            assert len(admitted) == 1
            order.append(admitted[0][0])
            _finish(admitted[0][0], "done")
    a_jobs = [s["job"] for s in client.get(f"/v1/batches/{big['id']}/report", headers=auth).json()["shots"]]
    assert order == [a_jobs[0], b_job, a_jobs[1], a_jobs[2]]


def test_admission_reads_each_stations_oldest_open_shots(client: TestClient, auth: dict[str, str],
                                                         import_root: Path) -> None:
    """A pass reads only the shots it may pick, each station's oldest outside a closed window (found from outside:
    it read every waiting shot, each second); shots of a window not yet open take no station's turn."""
    from services.batches.admission import _waiting

    later = _create(client, auth, paths=["night"], not_before=(utcnow() + dt.timedelta(hours=1)).isoformat())
    tonight = _create(client, auth, paths=["night"])
    other = _create(client, _token("station-b"), paths=["night/shot_00.dng"])

    def shots(batch: dict) -> list[str]:
        with session_scope() as session:
            return list(session.scalars(select(Job.id).where(Job.batch_id == batch["id"])
                                        .order_by(Job.created_at, Job.id)))

    with session_scope() as session:
        assert {r.id for r in _waiting(session, {later["id"]}, 2)} == {*shots(tonight)[:2], *shots(other)}
        admitted = {job for job, _ in admission_pass(session, get_settings(), capacity=4).ingest}
    assert admitted == {*shots(tonight), *shots(other)}  # none of the later window's


def test_ending_batches_reads_every_open_batch_at_once(client: TestClient, auth: dict[str, str],
                                                      import_root: Path) -> None:
    """Each admission pass (every second) asks about every open batch in one query, not one query a batch."""
    from sqlalchemy import event

    from services.batches.admission import finish_batches
    from services.db.session import get_engine

    seen: list[str] = []

    def record(*args: object) -> None:
        seen.append(str(args[2]))

    def statements_of_a_pass() -> int:
        seen.clear()
        event.listen(get_engine(), "before_cursor_execute", record)
        try:
            with session_scope() as session:
                finish_batches(session, utcnow())
        finally:
            event.remove(get_engine(), "before_cursor_execute", record)
        return len(seen)

    _create(client, auth, paths=["night/shot_00.dng"])
    one = statements_of_a_pass()
    ended = _create(client, auth, paths=["night/shot_01.dng"])
    _create(client, auth, paths=["night/shot_02.dng"])
    with session_scope() as session:
        session.execute(update(Job).where(Job.batch_id == ended["id"]).values(status="done", finished_at=utcnow()))
    assert statements_of_a_pass() == one + 1  # the one that ended is claimed; the rest cost nothing more
    assert client.get(f"/v1/batches/{ended['id']}", headers=auth).json()["status"] == "done"


def test_a_lost_webhook_message_is_found_again(client: TestClient, auth: dict[str, str], import_root: Path) -> None:
    from services.batches.admission import unsent_notifications

    batch = _create(client, auth, paths=["night/shot_00.dng"], webhook_url="http://10.0.0.9:9/x")
    with session_scope() as session:
        (job_id, _), = admission_pass(session, get_settings(), capacity=1).ingest
    _finish(job_id, "done")
    with session_scope() as session:
        assert admission_pass(session, get_settings(), capacity=1).finished == [batch["id"]]
        assert unsent_notifications(session, stale_after_s=60) == []  # just finished: its message may be on the way
        assert unsent_notifications(session, stale_after_s=-1) == [batch["id"]]


def test_migration_matches_the_models_and_downgrades(db: str) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine, inspect

    from services.db.migrate import alembic_config
    from services.db.models import Base

    engine = create_engine(db)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    command.downgrade(alembic_config(db), "0001")
    assert "batches" not in inspect(engine).get_table_names()
    assert {"batch_id", "admitted_at"}.isdisjoint(c["name"] for c in inspect(engine).get_columns("jobs"))
    command.upgrade(alembic_config(db), "head")
    assert "batches" in inspect(create_engine(db)).get_table_names()
    engine.dispose()


def test_an_admin_sees_and_cancels_every_stations_batches_but_adds_no_shots(client: TestClient,
                                                                          auth: dict[str, str],
                                                                          synth_dir: Path) -> None:
    """Found from outside: API.md says an admin sees every station's jobs and batches; batches answered 404."""
    batch = _create(client, auth, name="night-a")
    _create(client, _token("station-b"), name="night-b")
    with session_scope() as session:
        admin = {"Authorization": f"Bearer {create_station_token(session, 'it', role='admin')}"}
    assert client.get(f"/v1/batches/{batch['id']}", headers=admin).status_code == 200
    assert client.get(f"/v1/batches/{batch['id']}/report", headers=admin).status_code == 200
    names = {b["name"] for b in client.get("/v1/batches", headers=admin).json()["batches"]}
    assert names == {"night-a", "night-b"}
    only_a = client.get("/v1/batches?station=station-a", headers=admin).json()["batches"]
    assert [b["name"] for b in only_a] == ["night-a"]
    assert client.get(f"/v1/batches/{batch['id']}", headers=_token("station-c")).status_code == 404
    frame = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    shot = client.post(f"/v1/batches/{batch['id']}/shots", headers=admin, files=[("frames", ("a.dng", frame))])
    assert shot.status_code == 403, shot.text
    assert client.post(f"/v1/batches/{batch['id']}/cancel", headers=admin).status_code == 200
