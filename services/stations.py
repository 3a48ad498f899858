"""Principals and their bearer tokens (stored as SHA-256 hashes, shown once): capture stations, which see their
own work, and studio admins, which see and act on every station's work.

:func:`ensure_visible` is the one authorisation check for anything a station owns (jobs, batches): a station
asking for another station's work gets the same 404 as for work that does not exist.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import Station, as_utc, utcnow
from services.errors import BadInput, Conflict, Forbidden, NotFound, Unauthorized

TOKEN_PREFIX = "strata_"
ROLES = ("station", "admin")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 200:
        raise BadInput("station name must be 1-200 characters")
    if not name.isprintable() or "/" in name:  # NUL, tabs, newlines; a "/" cannot be named in DELETE /v1/tokens/{name}
        raise BadInput(f"station name {name!r} may not contain control characters or '/'")
    return name


def create_station_token(session: Session, name: str, *, replace: bool = False, role: str = "station") -> str:
    """Create principal ``name`` (or give it a new token when ``replace``); returns the plaintext token.
    A revoked name may be created again: it gets a new token and is live again."""
    name = _check_name(name)
    if role not in ROLES:
        raise BadInput(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    station = session.scalars(select(Station).where(Station.name == name)).one_or_none()
    if station is not None and not replace and station.revoked_at is None:
        raise Conflict(f"station {name!r} exists; rotate its token (strata token create --rotate) or pick another "
                       f"name")
    if station is not None and replace and station.revoked_at is None and station.role != role:
        raise Conflict(f"{name!r} is a live {station.role}: a rotation keeps the role; revoke it and create it "
                       f"again as {'an admin' if role == 'admin' else 'a station'}")
    if station is None:
        session.add(Station(name=name, token_hash=hash_token(token), role=role))
    else:
        station.token_hash, station.role, station.revoked_at = hash_token(token), role, None
    session.commit()
    return token


def authenticate(session: Session, token: str | None) -> Station:
    """The principal a bearer token belongs to; Unauthorized otherwise (also for a revoked one)."""
    if not token:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    station = session.scalars(select(Station).where(Station.token_hash == hash_token(token))).one_or_none()
    if station is None or station.revoked_at is not None:
        raise Unauthorized("invalid token")
    return station


def ensure_visible(principal: Station, owner_id: str, what: str) -> None:
    """The one authorisation check for owned work: admins see everything, a station only its own; NotFound
    (naming ``what``) otherwise, exactly as for work that does not exist."""
    if not principal.is_admin and principal.id != owner_id:
        raise NotFound(f"{what} not found")


def ensure_admin(principal: Station) -> None:
    """Admin-only actions: a station token is refused (403)."""
    if not principal.is_admin:
        raise Forbidden("this needs an admin token (strata token create --admin)")


def owner_filter(principal: Station, station: str | None, session: Session) -> str | None:
    """The station id a list is limited to: a station's own id always; for an admin the station named
    ``station`` (NotFound when there is none), or None for every station."""
    if not principal.is_admin:
        return principal.id
    if not station:
        return None
    found = session.scalars(select(Station).where(Station.name == station)).one_or_none()
    if found is None:
        raise NotFound(f"station {station!r} not found")
    return found.id


@dataclass(frozen=True)
class TokenInfo:
    name: str
    role: str
    created_at: str
    revoked: bool


def utc_text(value: dt.datetime) -> str:
    """A time as the API writes every time: ISO 8601 in UTC with ``Z`` (job objects, CSV, webhooks)."""
    return as_utc(value).isoformat().replace("+00:00", "Z")


def list_tokens(session: Session) -> list[TokenInfo]:
    """Every principal, by name (no token: only its hash is stored)."""
    return [TokenInfo(s.name, s.role, utc_text(s.created_at), s.revoked_at is not None)
            for s in session.scalars(select(Station).order_by(Station.name))]


def revoke_token(session: Session, name: str) -> None:
    """Revoke a principal's token: it is refused from now on; its jobs stay (and stay visible to admins)."""
    station = session.scalars(select(Station).where(Station.name == name.strip())).one_or_none()
    if station is None or station.revoked_at is not None:
        raise NotFound(f"no live token named {name!r}")
    station.revoked_at = utcnow()
    station.token_hash = hash_token("revoked:" + secrets.token_hex(16))
    session.commit()
