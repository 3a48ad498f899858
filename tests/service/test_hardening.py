"""Hardening of the API: the ingest outbox (broker down), Idempotency-Key, no 500 on bad input, failed-auth
back-off. Real database (SQLite and PostgreSQL), real Redis, the real Celery producer; no workers."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.config import get_settings
from services.db.models import IdempotencyKey, Job
from services.db.session import session_scope
from services.stations import create_station_token


@pytest.fixture
def client(db: str, redis_url: str) -> Iterator[TestClient]:
    from api.app import create_app

    redis.Redis.from_url(redis_url).flushdb()
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def auth(client: TestClient) -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {create_station_token(session, 'station-a')}"}


def _frame(synth_dir: Path) -> bytes:
    return (synth_dir / "iq3s" / "frame_00.dng").read_bytes()


def _messages_for(job_id: str) -> int:
    """Ingest messages for ``job_id`` waiting in the coordinator queue (every priority step)."""
    client = redis.Redis.from_url(get_settings().redis_url or "")
    return sum(job_id.encode() in m for k in client.scan_iter("coordinator*") if client.type(k) == b"list"
               for m in client.lrange(k, 0, -1))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_upload_while_the_broker_is_down_is_accepted_and_sent_later_once(
        client: TestClient, auth: dict[str, str], synth_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import app as worker_app
    from workers.tasks import send_outbox

    with broker_down_ctx(worker_app):
        r = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))])
        assert r.status_code == 202, r.text  # told the job exists: the outbox owes it a message
    job_id = r.json()["id"]
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.enqueued_at is None and job.admitted_at is not None
    assert _messages_for(job_id) == 0
    monkeypatch.setenv("STRATA_OUTBOX_GRACE_S", "0")
    get_settings.cache_clear()
    assert send_outbox() == 1  # the coordinator's outbox pass, once the broker answers
    assert send_outbox() == 0  # ... and only once
    assert _messages_for(job_id) == 1
    with session_scope() as session:
        assert session.get(Job, job_id).enqueued_at is not None  # type: ignore[union-attr]


class broker_down_ctx:  # noqa: N801 - used like a function
    def __init__(self, worker_app: object) -> None:
        self.app = worker_app.celery_app  # type: ignore[attr-defined]

    def _reset(self, url: str) -> None:
        self.app.conf.broker_url = url
        self.app._pool = None
        self.app.amqp._producer_pool = None

    def __enter__(self) -> None:
        self.saved = self.app.conf.broker_url
        self._reset(f"redis://127.0.0.1:{_closed_port()}/0")

    def __exit__(self, *_: object) -> None:
        self._reset(self.saved)


def test_an_interactive_upload_is_sent_at_once(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    job_id = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))]).json()["id"]
    assert _messages_for(job_id) == 1
    with session_scope() as session:
        assert session.get(Job, job_id).enqueued_at is not None  # type: ignore[union-attr]


def test_idempotency_key_returns_the_same_job(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    frame = _frame(synth_dir)
    headers = {**auth, "Idempotency-Key": "shot-0001"}
    first = client.post("/v1/jobs", headers=headers, files=[("frames", ("a.dng", frame))], data={"priority": "batch"})
    again = client.post("/v1/jobs", headers=headers, files=[("frames", ("a.dng", frame))], data={"priority": "batch"})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
    assert len(client.get("/v1/jobs", headers=auth).json()["jobs"]) == 1
    stored = list(get_settings().resolved_storage_dir.rglob("*.dng"))
    assert len(stored) == 1  # the retry's upload was not kept
    other = client.post("/v1/jobs", headers=headers, files=[("frames", ("a.dng", frame))],
                        data={"priority": "interactive"})
    assert other.status_code == 409 and other.json()["type"] == "idempotency_conflict"
    with session_scope() as session:  # another station's key space is its own
        b = {"Authorization": f"Bearer {create_station_token(session, 'station-b')}", "Idempotency-Key": "shot-0001"}
    assert client.post("/v1/jobs", headers=b, files=[("frames", ("a.dng", frame))]).json()["id"] != first.json()["id"]


def test_a_refused_upload_frees_its_key(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    headers = {**auth, "Idempotency-Key": "k1"}
    bad = client.post("/v1/jobs", headers=headers, files=[("frames", ("a.dng", b"not a raw" * 100))])
    assert bad.status_code == 422
    with session_scope() as session:
        assert session.query(IdempotencyKey).count() == 0
    ok = client.post("/v1/jobs", headers=headers, files=[("frames", ("a.dng", _frame(synth_dir)))])
    assert ok.status_code == 202


def test_idempotent_batches_and_batch_shots(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    headers = {**auth, "Idempotency-Key": "batch-1"}
    first = client.post("/v1/batches", headers=headers, json={"name": "tuesday"})
    again = client.post("/v1/batches", headers=headers, json={"name": "tuesday"})
    assert first.status_code == again.status_code == 201 and first.json()["id"] == again.json()["id"]
    assert client.post("/v1/batches", headers=headers, json={"name": "wednesday"}).status_code == 409
    batch = first.json()["id"]
    shot = {**auth, "Idempotency-Key": "shot-1"}
    frame = _frame(synth_dir)
    a = client.post(f"/v1/batches/{batch}/shots", headers=shot, files=[("frames", ("a.dng", frame))])
    b = client.post(f"/v1/batches/{batch}/shots", headers=shot, files=[("frames", ("a.dng", frame))])
    assert a.status_code == b.status_code == 202 and a.json()["id"] == b.json()["id"]
    assert client.get(f"/v1/batches/{batch}", headers=auth).json()["counts"]["queued"] == 1


def test_bad_idempotency_key_is_422(client: TestClient, auth: dict[str, str]) -> None:
    r = client.post("/v1/batches", headers={**auth, "Idempotency-Key": "x" * 300}, json={"name": "n"})
    assert r.status_code == 422 and set(r.json()) == {"type", "detail"}


def _nested_cursor(depth: int) -> str:
    return base64.urlsafe_b64encode(b"[" * depth + b"]" * depth).decode()


@pytest.mark.parametrize("cursor", [_nested_cursor(100_000)[:200], _nested_cursor(5000), "x" * 10_000,
                                    base64.urlsafe_b64encode(b'[1, 2]').decode(), "%%%", "W10="])
def test_bad_cursors_are_422(client: TestClient, auth: dict[str, str], cursor: str) -> None:
    for path in ("/v1/jobs", "/v1/batches"):
        r = client.get(path, headers=auth, params={"cursor": cursor})
        assert r.status_code == 422, (path, r.text)
        assert r.json()["type"] == "invalid_input"


def test_deeply_nested_cursor_under_the_cap_is_422(client: TestClient, auth: dict[str, str]) -> None:
    cursor = _nested_cursor(96)  # 256 base64 characters of brackets: parsed, refused
    assert client.get("/v1/jobs", headers=auth, params={"cursor": cursor[:256]}).status_code == 422


def _multipart(boundary: str, parts: list[tuple[str, bytes]]) -> bytes:
    out = b""
    for name, value in parts:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").encode() + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_long_boundary_and_many_fields_are_4xx(client: TestClient, auth: dict[str, str]) -> None:
    boundary = "b" * 300
    r = client.post("/v1/jobs", headers={**auth, "Content-Type": f"multipart/form-data; boundary={boundary}"},
                    content=_multipart(boundary, [("camera", b"IQ3_S")]))
    assert r.status_code == 422 and "boundary" in r.json()["detail"]
    many = _multipart("xyz", [(f"f{i}", b"v") for i in range(500)])
    r = client.post("/v1/jobs", headers={**auth, "Content-Type": "multipart/form-data; boundary=xyz"}, content=many)
    assert r.status_code == 422 and "too many form fields" in r.json()["detail"]
    # the connection stays usable: the next request on the same client answers normally
    assert client.get("/v1/jobs", headers=auth).status_code == 200


def test_header_caps_answer_431(client: TestClient, auth: dict[str, str]) -> None:
    r = client.get("/v1/jobs", headers={**auth, **{f"x-h{i}": "v" for i in range(150)}})
    assert r.status_code == 431 and r.json()["type"] == "headers_too_large"


def test_failed_auth_backs_off_per_address(client: TestClient, auth: dict[str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_AUTH_FAILURES", "3")
    monkeypatch.setenv("STRATA_AUTH_BACKOFF_S", "30")
    get_settings.cache_clear()
    wrong = {"Authorization": "Bearer strata_wrong"}
    assert [client.get("/v1/jobs", headers=wrong).status_code for _ in range(2)] == [401, 401]
    assert client.get("/v1/jobs", headers=auth).status_code == 200  # a correct token resets the count
    codes = [client.get("/v1/jobs", headers=wrong).status_code for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    blocked = client.get("/v1/jobs", headers=wrong)  # the block holds for wrong tokens from that address
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
    assert blocked.json()["type"] == "too_many_requests"
    r = redis.Redis.from_url(get_settings().redis_url or "")
    assert r.pttl("strata:auth-block:testclient") > 0
    # Found from outside: a valid station sharing the address (a NAT, a proxy; or an address another client named
    # in X-Forwarded-For) was locked out too. A valid token always passes.
    assert client.get("/v1/jobs", headers=auth).status_code == 200
    r.delete("strata:auth-block:testclient")


def test_an_upload_holds_no_database_connection_while_its_body_streams(client: TestClient, auth: dict[str, str],
                                                                      synth_dir: Path) -> None:
    """The token lookup's connection goes back to the pool before the body is read: uploads take as long as the
    network makes them, and 40 at once once exhausted the pool (500 "QueuePool limit ... reached")."""
    from services.db.session import get_engine

    frame = _frame(synth_dir)
    boundary = "strata-slow-upload"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="frames"; filename="a.dng"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n").encode()
    seen: list[int] = []

    def body() -> Iterator[bytes]:
        yield head + frame[: len(frame) // 2]
        seen.append(get_engine().pool.checkedout())  # type: ignore[attr-defined]  # the upload is mid-body here
        yield frame[len(frame) // 2 :] + f"\r\n--{boundary}--\r\n".encode()

    r = client.post("/v1/jobs", headers={**auth, "Content-Type": f"multipart/form-data; boundary={boundary}"},
                    content=body())
    assert r.status_code == 202, r.text
    assert seen == [0]


def test_sixty_uploads_at_once_are_all_accepted(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    """More uploads at once than the pool has connections (5 + 10) and the threadpool threads (40): a request
    once held its connection while it waited for a thread that all waited for a connection (a deadlock until the
    pool's 30 s timeout: 500s, some for jobs already recorded)."""
    from concurrent.futures import ThreadPoolExecutor

    frame = _frame(synth_dir)

    def upload(i: int) -> int:
        return client.post("/v1/jobs", headers=auth, files=[("frames", (f"f{i}.dng", frame))]).status_code

    with ThreadPoolExecutor(60) as pool:
        codes = list(pool.map(upload, range(60)))
    assert codes == [202] * 60
    with session_scope() as session:
        assert session.query(Job).count() == 60


def test_a_locked_database_is_a_503_that_says_so(db: str, auth: dict[str, str], client: TestClient,
                                                  synth_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: another process holding SQLite's write lock made an upload a generic 500 after 30 s,
    its traceback logged twice. Now a 503 `database_unavailable` naming the lock, with Retry-After; nothing kept."""
    import sqlite3

    from services.db.session import reset_engine

    if not db.startswith("sqlite"):
        pytest.skip("a file lock held by another process is SQLite's case")
    monkeypatch.setenv("STRATA_DB_BUSY_TIMEOUT_S", "0.5")
    get_settings.cache_clear()
    reset_engine()
    holder = sqlite3.connect(db.split("///", 1)[-1], isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        r = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "database_unavailable" and "locked" in r.json()["detail"]
    assert r.headers["retry-after"] == "5"
    with session_scope() as session:
        assert session.query(Job).count() == 0
    get_settings.cache_clear()


def test_nul_characters_and_odd_token_names_are_refused(client: TestClient, auth: dict[str, str]) -> None:
    """Found from outside: on PostgreSQL a NUL in a query value, a path or a token name was a 500 (its text columns
    hold none); a token name with a tab broke `strata token list`, one with '/' could not be revoked over REST;
    a rotation silently turned a station into an admin."""
    from services.errors import BadInput, Conflict

    assert client.get("/v1/jobs?q=a%00b", headers=auth).status_code == 422
    assert client.get("/v1/jobs/ab%00cd", headers=auth).status_code == 422
    with session_scope() as session:
        for bad in ("nul\x00x", "tab\tname", "a/b"):
            with pytest.raises(BadInput):
                create_station_token(session, bad)
        create_station_token(session, "studio-b")
        with pytest.raises(Conflict, match="keeps the role"):
            create_station_token(session, "studio-b", replace=True, role="admin")
        create_station_token(session, "studio-b", replace=True)  # a plain rotation still works


def test_hostile_bodies_and_values_are_4xx_before_anything_reads_them(client: TestClient, auth: dict[str, str],
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside (a security probe): a 100 MB JSON body without a token was parsed before its 401 (750 MiB
    more in the API); a NUL or a 5000-character import path, a Range of 5000 digits were 500s; the import root's
    full path showed in refusals; a token wrapped in a query value passed the URL guard."""
    import_root = tmp_path / "import"
    import_root.mkdir()
    monkeypatch.setenv("STRATA_IMPORT_ROOT", str(import_root))
    get_settings.cache_clear()
    big = b"[" + b"0," * 600_000 + b"0]"
    r = client.post("/v1/tokens", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["type"] == "body_too_large"
    r = client.post("/v1/batches", headers={**auth, "Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                    content=iter([b'{"name": "x"}']))
    assert r.status_code == 411 and r.json()["type"] == "length_required"
    for path in ("a\u0000b", "x" * 5000):
        r = client.post("/v1/batches", headers=auth, json={"name": "p", "paths": [path]})
        assert r.status_code == 422 and "cannot be used" in r.json()["detail"], r.text
    r = client.post("/v1/batches", headers=auth, json={"name": "p", "paths": ["nowhere/a.dng"]})
    assert r.status_code == 422 and str(import_root) not in r.text
    token = auth["Authorization"].split()[1]
    for query in (f"q=Bearer%20{token}", f"q=%20{token}", f"x={token}%2C"):
        assert client.get(f"/v1/jobs?{query}").status_code == 401, query
    jobs = client.get("/v1/jobs", headers=auth)
    assert jobs.headers["cache-control"] == "private, no-store"


def test_small_disclosures_found_by_the_security_probe(client: TestClient) -> None:
    """A Range of 5000 digits (a 500), a file name a spreadsheet runs as a formula in the CSV report, another
    station's job and shard ids in GET /v1/workers, the dashboard without a CSP."""
    from api.routes.jobs import _parse_range
    from api.routes.workers import Visible, _out
    from services.batches.report import _cell
    from services.errors import RangeNotSatisfiable
    from workers.registry import WorkerInfo

    with pytest.raises(RangeNotSatisfiable):
        _parse_range("bytes=0-" + "9" * 5000, 100)
    assert _cell("=HYPERLINK(\"http://evil\")") == "'=HYPERLINK(\"http://evil\")" and _cell("shot.dng") == "shot.dng"
    assert _cell("@SUM(1)") == "'@SUM(1)" and _cell(3.5) == 3.5
    busy = WorkerInfo(name="coordinator@h", kind="coordinator", gpu="cpu", device="cpu", queue="q", host="h", pid=1,
                      shards=(7,), current_shard=7, jobs=("another-stations-job",))
    seen = _out(busy, Visible(frozenset(), frozenset()))  # a station that owns neither
    assert seen.busy and seen.jobs == [] and seen.shards == [] and seen.current_shard is None
    assert _out(busy, Visible()).jobs == ["another-stations-job"] and _out(busy, Visible()).current_shard == 7
    page = client.get("/dashboard")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff"
