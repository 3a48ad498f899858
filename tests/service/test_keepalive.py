"""Over a real HTTP/1.1 connection (uvicorn on loopback): parse errors are 4xx and the keep-alive connection
stays usable for the next request."""

from __future__ import annotations

import base64
import http.client
import threading
import time
from collections.abc import Iterator

import pytest

from services.db.session import session_scope
from services.stations import create_station_token
from workers.launcher import free_port


@pytest.fixture
def server(db: str) -> Iterator[int]:
    import uvicorn

    from api.app import create_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning",
                                        lifespan="off"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield port
    srv.should_exit = True
    thread.join(10)


def test_parse_errors_keep_the_connection(server: int) -> None:
    with session_scope() as session:
        token = create_station_token(session, "keepalive")
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    auth = {"Authorization": f"Bearer {token}"}
    nested = base64.urlsafe_b64encode(b"[" * 90 + b"]" * 90).decode()
    boundary = "b" * 300
    requests = [
        ("GET", f"/v1/jobs?cursor={nested}", None, {}),
        ("POST", "/v1/jobs", f"--{boundary}--\r\n".encode(),
         {"Content-Type": f"multipart/form-data; boundary={boundary}"}),
        ("POST", "/v1/jobs", b"--x\r\nContent-Disposition: form-data; name=a\r\n\r\nv\r\n--x--\r\n" * 200,
         {"Content-Type": "multipart/form-data; boundary=x"}),
        ("POST", "/v1/batches", b"{not json", {"Content-Type": "application/json"}),
    ]
    sock = None
    for method, path, body, headers in requests:
        conn.request(method, path, body=body, headers={**auth, **headers})
        response = response_of(conn)
        assert 400 <= response[0] < 500, (method, path, response)
        assert sock is None or conn.sock is sock  # the same connection each time
        sock = conn.sock
    conn.request("GET", "/v1/jobs", headers=auth)
    assert response_of(conn)[0] == 200 and conn.sock is sock


def response_of(conn: http.client.HTTPConnection) -> tuple[int, bytes]:
    r = conn.getresponse()
    body = r.read()
    assert r.getheader("connection", "").lower() != "close"
    return r.status, body
