"""The batch-finished notification: its payload and its HMAC-SHA256 signature."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from typing import Any
from urllib.parse import urlparse

from services.errors import BadInput

SIGNATURE_HEADER = "X-Strata-Signature"
EVENT = "batch.finished"


def check_url(url: str | None) -> str | None:
    if url is None or not url.strip():
        return None
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise BadInput(f"webhook_url {url!r} is not an http(s) URL")
    try:
        address = ipaddress.ip_address(parsed.hostname or "")
    except ValueError:
        return url.strip()  # a host name (a studio's LAN addresses stay allowed)
    if address.is_link_local or address.is_multicast or address.is_unspecified:
        # 169.254.169.254 is a cloud host's metadata service: a batch must not make the server call it
        raise BadInput(f"webhook_url {url!r} names a link-local, multicast or unspecified address")
    return url.strip()


def payload(batch: dict[str, Any]) -> bytes:
    """The JSON body sent (its exact bytes are what is signed)."""
    body = {"event": EVENT, "batch": batch, "report_url": f"/v1/batches/{batch['id']}/report"}
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str).encode()


def sign(secret: str, body: bytes) -> str:
    """The header value: ``sha256=<hex HMAC-SHA256 of the raw body with the batch's secret>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    return hmac.compare_digest(sign(secret, body), header.strip())
