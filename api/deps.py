"""FastAPI dependencies: database session and the authenticated station."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated

import redis
from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from services.auth_backoff import AuthBackoff, BackoffPolicy
from services.config import get_settings
from services.db.models import Station
from services.db.session import get_session
from services.errors import BadInput, Unauthorized
from services.stations import TOKEN_PREFIX, authenticate

# Query parameters that look like credentials: refused on every route (URLs end up in logs and histories).
TOKEN_PARAMS = {"token", "access_token", "api_key", "apikey", "auth", "authorization", "bearer"}
# A value shaped like a Strata token (its prefix and 43 URL-safe characters; a file name such as strata_0001.dng in a
# search is not one).
TOKEN_SHAPE = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]{32,}")

# Closed when the route function returns, before the response is sent: a streamed download (a 387 MB TIFF to a
# slow client) holds no database connection (25 at once exhausted the pool: every other request 500 after 30 s).
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


@lru_cache(maxsize=4)
def _backoff(url: str, failures: int, base_s: float, max_s: float) -> AuthBackoff:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    return AuthBackoff(client, BackoffPolicy(failures, base_s, max_s))


def auth_backoff() -> AuthBackoff:
    settings = get_settings()
    return _backoff(settings.redis_url or "redis://127.0.0.1:6379/0", settings.auth_failures,
                    settings.auth_backoff_s, settings.auth_backoff_max_s)


def current_station(
    request: Request, session: SessionDep,
    authorization: Annotated[str | None, Header(description="Bearer <token>")] = None,
) -> Station:
    token = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            token = value.strip()
    if not token:
        return authenticate(session, token)  # 401; a missing token is not counted
    address = request.client.host if request.client else "unknown"
    backoff = auth_backoff()
    try:
        station = authenticate(session, token)
    except Unauthorized:
        # Checked after the token, so a valid one always passes (found from outside: a station sharing an address,
        # a NAT or a proxy, with a guesser, or whose address another client named in X-Forwarded-For, got 429)
        backoff.check(address)
        backoff.failed(address)
        raise
    finally:
        # The lookup's connection goes back to the pool before the route awaits anything: a request holding one
        # while it waits for a threadpool thread, whose threads all wait for a connection, deadlocked 60 uploads
        # at once until the pool's 30 s timeout (500s).
        session.commit()
    backoff.succeeded(address)
    return station


StationDep = Annotated[Station, Depends(current_station)]


def refuse_token_in_query(request: Request) -> None:
    """A token in a URL is refused with 401 on every route, whether or not it is valid."""
    if "\x00" in request.scope.get("path", ""):  # no database column holds one (PostgreSQL: a 500 before)
        raise BadInput("a NUL character is not accepted in the URL")
    for key, value in request.query_params.multi_items():
        if "\x00" in key or "\x00" in value:
            raise BadInput("a NUL character is not accepted in the URL query string")
        if key.lower() in TOKEN_PARAMS or TOKEN_SHAPE.search(value):
            raise Unauthorized("tokens are not accepted in the URL query string; send the header "
                               "'Authorization: Bearer <token>' instead (and consider this token exposed)")
