"""Failed-auth back-off per client address, kept in Redis so every API process sees the same count.

After ``STRATA_AUTH_FAILURES`` wrong tokens in a row from one address, every request from it is answered 429
(with ``Retry-After``) for ``STRATA_AUTH_BACKOFF_S``, doubling with each further wrong token up to
``STRATA_AUTH_BACKOFF_MAX_S``; a correct token resets the count. The block holds before the token is checked
(a correct guess during it does not pass). A missing token is not counted. Redis being away does not stop the
API: the back-off is then skipped (and logged).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

import redis

from services.errors import TooManyRequests

log = logging.getLogger(__name__)
COUNT_TTL_S = 3600  # a run of failures is forgotten an hour after the last one
WARN_EVERY_S = 60.0  # Redis away: one warning a minute per kind, not one per request (a poller made six a second)
_warned: dict[str, float] = {}
_warned_lock = threading.Lock()


def _warn(what: str, exc: Exception) -> None:
    now = time.monotonic()
    with _warned_lock:
        if now - _warned.get(what, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        _warned[what] = now
    log.warning("auth back-off %s (Redis unreachable: %s; said once a minute while it lasts)", what, exc)


@dataclass(frozen=True)
class BackoffPolicy:
    failures: int
    base_s: float
    max_s: float

    def period(self, count: int) -> float:
        """Seconds an address is refused after its ``count``-th failure in a row (0: not yet)."""
        if self.failures <= 0 or count < self.failures:
            return 0.0
        return float(min(self.base_s * 2 ** min(count - self.failures, 30), self.max_s))


class AuthBackoff:
    def __init__(self, client: redis.Redis, policy: BackoffPolicy) -> None:
        self.client, self.policy = client, policy

    @staticmethod
    def _keys(address: str) -> tuple[str, str]:
        return f"strata:auth-fail:{address}", f"strata:auth-block:{address}"

    def check(self, address: str) -> None:
        """TooManyRequests while ``address`` is blocked."""
        _, block = self._keys(address)
        try:
            ttl_ms = int(self.client.pttl(block))
        except redis.RedisError as exc:
            _warn("skipped", exc)
            return
        if ttl_ms > 0:
            raise TooManyRequests("too many wrong tokens from this address; wait before trying again",
                                  retry_after=max(1, math.ceil(ttl_ms / 1000)))

    def failed(self, address: str) -> None:
        count_key, block = self._keys(address)
        try:
            count = int(self.client.incr(count_key))
            self.client.expire(count_key, COUNT_TTL_S)
            period = self.policy.period(count)
            if period > 0:
                self.client.set(block, b"1", px=max(1, int(period * 1000)))
        except redis.RedisError as exc:
            _warn("not recorded", exc)

    def succeeded(self, address: str) -> None:
        try:
            self.client.delete(*self._keys(address))
        except redis.RedisError as exc:
            _warn("not reset", exc)
