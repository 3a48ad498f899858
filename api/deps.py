"""FastAPI dependencies: database session and the authenticated station."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from services.db.models import Station
from services.db.session import get_session
from services.errors import Unauthorized
from services.stations import TOKEN_PREFIX, authenticate

# Query parameters that look like credentials: refused on every route (URLs end up in logs and histories).
TOKEN_PARAMS = {"token", "access_token", "api_key", "apikey", "auth", "authorization", "bearer"}

SessionDep = Annotated[Session, Depends(get_session)]


def current_station(
    session: SessionDep, authorization: Annotated[str | None, Header(description="Bearer <token>")] = None
) -> Station:
    token = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            token = value.strip()
    return authenticate(session, token)


StationDep = Annotated[Station, Depends(current_station)]


def refuse_token_in_query(request: Request) -> None:
    """A token in a URL is refused with 401 on every route, whether or not it is valid."""
    for key, value in request.query_params.multi_items():
        if key.lower() in TOKEN_PARAMS or value.startswith(TOKEN_PREFIX):
            raise Unauthorized("tokens are not accepted in the URL query string; send the header "
                               "'Authorization: Bearer <token>' instead (and consider this token exposed)")
