"""The one error handler: domain errors and HTTP errors become {"type", "detail"} JSON."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from python_multipart.exceptions import FormParserError, MultipartParseError
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from services.errors import BrokerUnavailable, RangeNotSatisfiable, StorageUnavailable, StrataError, TooManyRequests

# Errors only a malformed request raises (a body or multipart stream that cannot be parsed, a client gone).
CLIENT_ERRORS: tuple[type[BaseException], ...] = (FormParserError, MultipartParseError, ClientDisconnect)

log = logging.getLogger(__name__)


def _body(type_: str, detail: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"type": type_, "detail": detail}, status_code=status, headers=headers)


def _missing_table(exc: DBAPIError) -> bool:
    """A table or column this code needs is not there: the database was never migrated to this release."""
    text = str(exc.orig)
    return "no such table" in text or "no such column" in text or ("does not exist" in text and (
        "relation" in text or "column" in text))


def _not_migrated(exc: DBAPIError) -> JSONResponse:
    # Found from outside: an API on an unmigrated database answered every request 500 (and /readyz 200).
    reason = str(exc.orig).splitlines()[0][:200]
    log.warning("database not migrated: %s", reason)
    return _body("database_unavailable", f"the database is not migrated to this release ({reason}): run `strata db "
                 f"upgrade`", 503, {"Retry-After": "5"})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StrataError)
    async def _strata(_: Request, exc: StrataError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if isinstance(exc, RangeNotSatisfiable):
            headers = {"Content-Range": f"bytes */{exc.size}"}
        if isinstance(exc, (TooManyRequests, StorageUnavailable, BrokerUnavailable)):
            headers = {"Retry-After": str(exc.retry_after)}
        if isinstance(exc, StorageUnavailable):
            log.warning("storage unavailable: %s", exc.detail)
        return _body(exc.type, exc.detail, exc.status_code, headers)

    @app.exception_handler(ProgrammingError)
    async def _schema(_: Request, exc: ProgrammingError) -> JSONResponse:
        if not _missing_table(exc):
            raise exc
        return _not_migrated(exc)

    @app.exception_handler(OperationalError)
    async def _database(_: Request, exc: OperationalError) -> JSONResponse:
        if _missing_table(exc):  # SQLite says it so
            return _not_migrated(exc)
        # The database away, locked past its busy timeout, or refusing connections: 503 with a reason and one log
        # line (a generic 500 after 30 s, logged twice with a traceback, told a station nothing)
        reason = str(exc.orig).splitlines()[0][:200] if exc.orig is not None else type(exc).__name__
        log.warning("database unavailable: %s", reason)
        return _body("database_unavailable", f"the database is unavailable ({reason}); retry shortly", 503,
                     {"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
        return _body("invalid_input", "; ".join(parts) or "invalid request", 422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        slug = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _body(slug, str(exc.detail), exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, CLIENT_ERRORS):  # the request was malformed: the client's fault, never a 500
            return _body("bad_request", f"malformed request: {type(exc).__name__}", 400)
        log.exception("unhandled error")
        return _body("internal_error", "internal error; see the server log", 500)
