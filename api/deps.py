"""FastAPI dependencies: database session and the authenticated station."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header
from sqlalchemy.orm import Session

from services.db.models import Station
from services.db.session import get_session
from services.stations import authenticate

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
