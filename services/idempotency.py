"""``Idempotency-Key`` on POSTs (Stripe-style): a retried request with the same key returns what the first one
created instead of creating it twice.

Keys are per principal (station); a key names one request: the same key with a different body (another
fingerprint) or on another operation is a :class:`IdempotencyConflict` (409), as is a retry while the first
request is still being handled. Keys are kept ``STRATA_IDEMPOTENCY_HOURS`` (24 h by default); an older key is
forgotten and may be used again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import IdempotencyKey, Station, as_utc, utcnow
from services.errors import BadInput, Conflict

MAX_KEY = 255
# A reservation whose request never finished (its process died) stops blocking retries after this long.
STALE_RESERVATION = dt.timedelta(minutes=5)


class IdempotencyConflict(Conflict):
    type = "idempotency_conflict"


def check_key(key: str | None) -> str | None:
    """The header's value, or None when absent; :class:`BadInput` for an empty, over-long or non-ASCII key."""
    if key is None:
        return None
    key = key.strip()
    if not key or len(key) > MAX_KEY or not key.isascii() or not key.isprintable():
        raise BadInput(f"Idempotency-Key must be 1-{MAX_KEY} printable ASCII characters")
    return key


def fingerprint(payload: object) -> str:
    """A stable hash of what a request asks for (JSON-serialisable: form fields, file hashes, a body)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """The outcome of :func:`claim`: ``replay`` is the id the first request created (return it again), else the
    key is now reserved for this request (``row_id``), to :func:`complete` or :func:`release`."""

    replay: str | None
    row_id: int | None


def claim(session: Session, station: Station, key: str, scope: str, print_: str, hours: float) -> Claim:
    """Replay the first request's result, refuse a conflicting one, or reserve the key for this request."""
    row = _live(session, station, key, hours)
    if row is None:
        row = IdempotencyKey(station_id=station.id, key=key, scope=scope, fingerprint=print_)
        session.add(row)
        try:
            session.commit()
        except IntegrityError:  # a concurrent request with the same key reserved it first
            session.rollback()
            row = _live(session, station, key, hours)
            if row is None:
                raise IdempotencyConflict("a request with this Idempotency-Key is in progress; retry") from None
        else:
            return Claim(None, row.id)
    if row.scope != scope or row.fingerprint != print_:
        raise IdempotencyConflict("this Idempotency-Key was used for a different request; use a new key")
    if row.resource_id is None:
        raise IdempotencyConflict("a request with this Idempotency-Key is in progress; retry")
    return Claim(row.resource_id, None)


def _live(session: Session, station: Station, key: str, hours: float) -> IdempotencyKey | None:
    """The key's row, dropping it first when expired (or a reservation left by a dead request)."""
    row = session.scalars(select(IdempotencyKey).where(IdempotencyKey.station_id == station.id,
                                                       IdempotencyKey.key == key)).one_or_none()
    if row is None:
        return None
    age = utcnow() - as_utc(row.created_at)
    if age > dt.timedelta(hours=hours) or (row.resource_id is None and age > STALE_RESERVATION):
        session.delete(row)
        session.commit()
        return None
    return row


def complete(session: Session, claim_: Claim, resource_id: str) -> None:
    if claim_.row_id is not None:
        row = session.get(IdempotencyKey, claim_.row_id)
        if row is not None:
            row.resource_id = resource_id
            session.commit()


def release(session: Session, claim_: Claim) -> None:
    """The request failed: its key may be used again (for the same or another request)."""
    if claim_.row_id is not None:
        session.rollback()
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == claim_.row_id))
        session.commit()


def prune(session: Session, hours: float) -> int:
    """Forget keys older than ``hours``."""
    cutoff = utcnow() - dt.timedelta(hours=hours)
    result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < cutoff))
    session.commit()
    return int(getattr(result, "rowcount", 0) or 0)
