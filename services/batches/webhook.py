"""The batch-finished notification: its payload and its HMAC-SHA256 signature."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import re
import socket
from typing import Any
from urllib.parse import urlparse

from services.errors import BadInput

SIGNATURE_HEADER = "X-Strata-Signature"
EVENT = "batch.finished"


# An IPv4 address written another way than dotted decimal (2852039166, 0xa9fea9fe, 169.254.43518, 0): the OS
# resolves them, ipaddress does not parse them (found from outside: they got round the address check).
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$", re.IGNORECASE)


def _forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool) -> str | None:
    """Why a webhook may not be sent to ``address`` (the server's own services, a cloud's metadata service at
    169.254.169.254), else None: a studio's network addresses are allowed."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for why, hit in (("link-local", address.is_link_local), ("multicast", address.is_multicast),
                     ("unspecified", address.is_unspecified), ("reserved", address.is_reserved),
                     ("loopback", address.is_loopback and not allow_loopback)):
        if hit:
            return why
    return None


def check_url(url: str | None, allow_loopback: bool = False) -> str | None:
    """A batch's ``webhook_url`` as given, or :class:`BadInput`: not http(s), an address written in another form
    than the usual one, or a link-local, multicast, unspecified, reserved or (unless ``allow_loopback``,
    STRATA_WEBHOOK_ALLOW_LOOPBACK) loopback address. A host name is checked again where it is sent
    (:func:`refused_address`)."""
    if url is None or not url.strip():
        return None
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise BadInput(f"webhook_url {url!r} is not an http(s) URL")
    host = parsed.hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if _NUMERIC_HOST.match(host):
            raise BadInput(f"webhook_url {url!r}: write an IP address in dotted form (a.b.c.d)") from None
        return url.strip()  # a host name (a studio's LAN addresses stay allowed)
    why = _forbidden(address, allow_loopback)
    if why is not None:
        raise BadInput(f"webhook_url {url!r} names a {why} address: not where a batch may send its notification")
    return url.strip()


def refused_address(url: str, allow_loopback: bool = False) -> str | None:
    """At delivery: why ``url``'s host resolves to an address :func:`check_url` refuses (a name pointed at the
    server itself or at 169.254.169.254), else None (also when it does not resolve: the delivery says so)."""
    host = urlparse(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    for info in infos:
        with contextlib.suppress(ValueError):
            why = _forbidden(ipaddress.ip_address(str(info[4][0]).split("%")[0]), allow_loopback)
            if why is not None:
                return f"refused: {host} resolves to a {why} address ({info[4][0]})"
    return None


def payload(batch: dict[str, Any]) -> bytes:
    """The JSON body sent (its exact bytes are what is signed)."""
    body = {"event": EVENT, "batch": batch, "report_url": f"/v1/batches/{batch['id']}/report"}
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str).encode()


def sign(secret: str, body: bytes) -> str:
    """The header value: ``sha256=<hex HMAC-SHA256 of the raw body with the batch's secret>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    return hmac.compare_digest(sign(secret, body), header.strip())
