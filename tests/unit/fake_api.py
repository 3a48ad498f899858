"""A small fake Strata API over real HTTP (a thread of ``http.server``) for the command line's unit tests: routes
are set per test, every request is recorded."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, Any]  # (status, JSON-able body, or bytes / str sent as they are)
Route = Callable[[Seen], Answer]


@dataclass
class FakeApi:
    url: str = ""
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def route(self, method: str, path: str, answer: Route | Answer) -> None:
        if callable(answer):
            self.routes[(method, path)] = answer
        else:
            fixed: Answer = answer
            self.routes[(method, path)] = lambda _seen: fixed

    def calls(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path == path]


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)

        def _answer(self) -> None:
            path, _, query = self.path.partition("?")
            body = self._body()
            seen = Seen(self.command, path, query, dict(self.headers), body)
            api.seen.append(seen)
            route = api.routes.get((self.command, path))
            status, payload = route(seen) if route else (404, {"type": "not_found", "detail": f"no {path}"})
            if isinstance(payload, bytes | str):
                data = payload.encode() if isinstance(payload, str) else payload
                ctype = "text/csv" if isinstance(payload, str) else "application/octet-stream"
            else:
                data, ctype = json.dumps(payload).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer  # noqa: N815 - http.server's names

    return Handler


@contextmanager
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()


def job(job_id: str, status: str = "queued", *, name: str = "frame_00", outputs: list[dict[str, Any]] | None = None,
        error: str | None = None) -> dict[str, Any]:
    """A job object as the API answers it."""
    return {"id": job_id, "status": status, "stage": status, "progress": 1.0 if status == "done" else 0.0,
            "camera": "IQ3_S", "recipe": "tiff16", "priority": "interactive", "frames": [{"name": f"{name}.dng"}],
            "shards": [], "outputs": outputs or [], "error": error, "created_at": "2026-12-01T10:00:00Z",
            "started_at": None, "finished_at": None}
