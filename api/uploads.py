"""Streaming multipart reception: RAW frames go straight to storage in chunks, hashed while written.

Starlette's form parser spools whole files to a temporary file first; this parser writes each chunk to its
final storage object (invisible until complete), enforces the per-file size limit as bytes arrive, and keeps
memory flat whatever the upload size.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import BinaryIO

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from services.errors import BadInput, StorageUnavailable, UploadTooLarge
from services.jobs.service import Upload, safe_name
from services.storage import Storage
from services.storage.keys import frame_key

MAX_FIELD_BYTES = 64 * 1024
MAX_PART_HEADER_BYTES = 8 * 1024
MAX_PART_HEADERS = 16
MAX_BOUNDARY = 200  # RFC 2046 allows 70; python-multipart refuses more than 256 from its constructor


@dataclass
class _FilePart:
    name: str
    key: str
    ctx: AbstractContextManager[BinaryIO]
    handle: BinaryIO
    original: str = ""
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    size: int = 0


@dataclass
class ReceivedForm:
    files: list[Upload]  # in upload order
    fields: dict[str, list[str]]


class _Receiver:
    def __init__(self, storage: Storage, job_id: str, max_bytes: int, max_files: int, file_field: str,
                 max_fields: int = 100) -> None:
        self.storage, self.job_id = storage, job_id
        self.max_bytes, self.max_files, self.file_field = max_bytes, max_files, file_field
        self.max_fields, self.n_fields = max_fields, 0
        self.headers: dict[bytes, bytes] = {}
        self._hname = b""
        self._hvalue = b""
        self.current: _FilePart | None = None
        self.field_name: str | None = None
        self.field_value = bytearray()
        self.files: list[Upload] = []
        self.fields: dict[str, list[str]] = {}
        self.open_parts: list[_FilePart] = []
        self.error: Exception | None = None
        self.pending: list[bytes] = []

    # python-multipart callbacks (synchronous; file writes are batched per network chunk)
    def on_part_begin(self) -> None:
        self.headers = {}

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._hname += data[start:end]
        if len(self._hname) > MAX_PART_HEADER_BYTES:
            raise BadInput("a multipart part header name is too long")

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._hvalue += data[start:end]
        if len(self._hvalue) > MAX_PART_HEADER_BYTES:
            raise BadInput("a multipart part header is too long")

    def on_header_end(self) -> None:
        if len(self.headers) >= MAX_PART_HEADERS:
            raise BadInput(f"a multipart part has more than {MAX_PART_HEADERS} headers")
        self.headers[self._hname.lower()] = self._hvalue
        self._hname = self._hvalue = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is not None:
            if name != self.file_field:
                raise BadInput(f"unexpected file field {name!r}; upload RAW files under {self.file_field!r}")
            if len(self.files) + 1 > self.max_files:
                raise BadInput(f"too many frames: at most {self.max_files} per job")
            index = len(self.files) + len(self.open_parts)
            original = filename.decode("utf-8", "replace")
            clean = safe_name(original, index)
            key = frame_key(self.job_id, index, clean)
            ctx = self.storage.writer(key)
            part = _FilePart(name=clean, key=key, ctx=ctx, handle=ctx.__enter__(),
                             original=original[:255])
            self.open_parts.append(part)
            self.current = part
        else:
            self.n_fields += 1
            if self.n_fields > self.max_fields:
                raise BadInput(f"too many form fields: at most {self.max_fields} besides the frames")
            self.current = None
            self.field_name = name
            self.field_value = bytearray()

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.current is not None:
            self.current.size += len(chunk)
            if self.current.size > self.max_bytes:
                raise UploadTooLarge(
                    f"frame {self.current.name!r} exceeds the per-file limit of {self.max_bytes // (1 << 20)} MiB"
                )
            self.current.digest.update(chunk)
            self.current.handle.write(chunk)
        else:
            self.field_value += chunk
            if len(self.field_value) > MAX_FIELD_BYTES:
                raise BadInput(f"form field {self.field_name!r} is too long")

    def on_part_end(self) -> None:
        if self.current is not None:
            part = self.current
            part.ctx.__exit__(None, None, None)  # publish the complete file
            self.open_parts.remove(part)
            self.files.append(Upload(part.name, part.key, part.digest.hexdigest(), part.size, part.original))
            self.current = None
        elif self.field_name is not None:
            self.fields.setdefault(self.field_name, []).append(self.field_value.decode("utf-8", "replace"))
            self.field_name = None

    def abort(self, exc: BaseException) -> None:
        for part in self.open_parts:
            part.ctx.__exit__(type(exc), exc, None)  # removes the partial file
        self.open_parts.clear()


async def receive_multipart(
    content_type: str,
    stream: AsyncIterator[bytes],
    storage: Storage,
    job_id: str,
    *,
    max_bytes: int,
    max_files: int,
    file_field: str = "frames",
    max_fields: int = 100,
) -> ReceivedForm:
    """Parse a multipart body from ``stream``; files land in storage as the job's uploads (``frame_key``).

    On any error the partial files are removed and the error propagates (the caller deletes the prefix).
    """
    ctype, options = parse_options_header(content_type)
    if ctype != b"multipart/form-data" or b"boundary" not in options:
        raise BadInput("expected a multipart/form-data body with RAW files under the field 'frames'")
    boundary = options[b"boundary"]
    if not boundary or len(boundary) > MAX_BOUNDARY:
        raise BadInput(f"multipart boundary must be 1-{MAX_BOUNDARY} characters")
    rx = _Receiver(storage, job_id, max_bytes, max_files, file_field, max_fields)
    parser = MultipartParser(
        boundary,
        callbacks={  # type: ignore[arg-type]
            "on_part_begin": rx.on_part_begin,
            "on_header_field": rx.on_header_field,
            "on_header_value": rx.on_header_value,
            "on_header_end": rx.on_header_end,
            "on_headers_finished": rx.on_headers_finished,
            "on_part_data": rx.on_part_data,
            "on_part_end": rx.on_part_end,
        },
    )
    try:
        async for chunk in stream:
            if chunk:
                await run_in_threadpool(parser.write, chunk)
        parser.finalize()
        if rx.open_parts:
            raise BadInput("the upload ended before a frame was complete")
    except BaseException as exc:
        rx.abort(exc)
        if isinstance(exc, (BadInput, UploadTooLarge, StorageUnavailable)):
            raise
        if isinstance(exc, Exception) and not isinstance(exc, OSError):
            raise BadInput(f"malformed multipart body: {exc}") from exc
        raise
    return ReceivedForm(files=rx.files, fields=rx.fields)
