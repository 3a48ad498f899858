"""Request header caps, before any route runs: too many headers or too many header bytes answer 431 with the
error shape (uvicorn's h11 also refuses a header block over 16 KiB with 400 before the app sees it)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_HEADERS = 100
MAX_HEADER_BYTES = 16 * 1024
# A body other than a multipart upload (JSON: a token, a batch) is small; found from outside: 100 MB JSON bodies
# sent without a token were read and parsed before the 401 (the API grew by 750 MiB).
MAX_BODY_BYTES = 1024 * 1024


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
            refusal = _body_refusal(dict(headers))
            if refusal is not None:
                await _refuse(send, refusal[2], refusal[0], refusal[1])
                return
            if scope.get("path", "").startswith("/v1/"):
                send = _private(send)
        await self.app(scope, receive, send)


def _private(send: Send) -> Send:
    """The API's answers (a station's jobs, outputs, tokens) are nobody else's: ``Cache-Control: private,
    no-store`` unless the route set its own (a preview: private, a few seconds), so no shared proxy keeps them."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and not any(
                k.lower() == b"cache-control" for k, _ in message.get("headers", [])):
            message = {**message, "headers": [*message.get("headers", []), (b"cache-control", b"private, no-store")]}
        await send(message)

    return sending


def _body_refusal(headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
    """(status, type, detail) for a body that is not an upload and is over :data:`MAX_BODY_BYTES`, or of unknown
    length (chunked), decided from the headers before a byte of it is read; None otherwise."""
    if headers.get(b"content-type", b"").lower().startswith(b"multipart/form-data"):
        return None  # uploads: capped by the upload routes themselves (STRATA_MAX_UPLOAD_MB)
    length = headers.get(b"content-length")
    if length is None:
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return 411, "length_required", "a request body other than a multipart upload needs a Content-Length"
        return None
    if not length.strip().isdigit() or len(length.strip()) > 15 or int(length) > MAX_BODY_BYTES:
        return 413, "body_too_large", f"a request body other than a multipart upload is at most {MAX_BODY_BYTES} bytes"
    return None


async def _refuse(send: Send, detail: str, status: int = 431, kind: str = "headers_too_large") -> None:
    body = json.dumps({"type": kind, "detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
