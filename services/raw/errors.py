"""Errors of the RAW layer: ``BadRawFile`` is the uploader's fault (4xx), ``RawDecodeError`` a job failure."""

from __future__ import annotations


class RawError(Exception):
    """Base class of RAW errors; ``reason`` is a short human-readable explanation."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRawFile(RawError):
    """The input is not a RAW file we can read, or it is truncated or corrupt."""


class RawDecodeError(RawError):
    """The decoder crashed, timed out, ran out of memory or reported a failure."""
