"""Capture stations and their bearer tokens (stored as SHA-256 hashes, shown once)."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import Station
from services.errors import Conflict, Unauthorized

TOKEN_PREFIX = "strata_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_station_token(session: Session, name: str, *, replace: bool = False) -> str:
    """Create station ``name`` (or give it a new token when ``replace``); returns the plaintext token."""
    name = name.strip()
    if not name or len(name) > 200:
        raise ValueError("station name must be 1-200 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    station = session.scalars(select(Station).where(Station.name == name)).one_or_none()
    if station is not None and not replace:
        raise Conflict(f"station {name!r} exists; use --rotate to issue it a new token")
    if station is None:
        session.add(Station(name=name, token_hash=hash_token(token)))
    else:
        station.token_hash = hash_token(token)
    session.commit()
    return token


def authenticate(session: Session, token: str | None) -> Station:
    """The station a bearer token belongs to; Unauthorized otherwise."""
    if not token:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    station = session.scalars(select(Station).where(Station.token_hash == hash_token(token))).one_or_none()
    if station is None:
        raise Unauthorized("invalid token")
    return station
