"""The notification a finished batch sends: what to POST where, signed (the queue adapter delivers it)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from services.batches import webhook
from services.batches.report import summary
from services.batches.service import batch_tallies
from services.db.models import Batch


@dataclass(frozen=True)
class Notification:
    url: str
    body: bytes
    headers: dict[str, str]


def notification(session: Session, batch_id: str) -> Notification | None:
    """The signed ``batch.finished`` message of a batch, or None (no webhook, gone, or delivered already)."""
    batch = session.get(Batch, batch_id)
    if batch is None or not batch.webhook_url or not batch.webhook_secret or batch.webhook_delivered_at:
        return None
    body = webhook.payload(summary(batch, batch_tallies(session, [batch.id])[batch.id]))
    headers = {"Content-Type": "application/json", webhook.SIGNATURE_HEADER: webhook.sign(batch.webhook_secret, body),
               "X-Strata-Event": webhook.EVENT}
    return Notification(batch.webhook_url, body, headers)
