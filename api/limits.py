"""Request header caps, before any route runs: too many headers or too many header bytes answer 431 with the
error shape (uvicorn's h11 also refuses a header block over 16 KiB with 400 before the app sees it)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

MAX_HEADERS = 100
MAX_HEADER_BYTES = 16 * 1024


class HeaderLimits:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope.get("headers", [])
            size = sum(len(k) + len(v) for k, v in headers)
            if len(headers) > MAX_HEADERS or size > MAX_HEADER_BYTES:
                await _refuse(send, f"request headers over the limit ({MAX_HEADERS} headers, "
                                    f"{MAX_HEADER_BYTES} bytes)")
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, detail: str) -> None:
    body = json.dumps({"type": "headers_too_large", "detail": detail}).encode()
    await send({"type": "http.response.start", "status": 431,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
