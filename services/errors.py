"""One error hierarchy for the domain; the API maps it to HTTP in a single handler."""

from __future__ import annotations


class StrataError(Exception):
    """Base error: ``type`` is a stable machine-readable slug, ``detail`` a human reason."""

    status_code = 500
    type = "internal_error"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BadInput(StrataError):
    status_code = 422
    type = "invalid_input"


class UnknownCamera(BadInput):
    type = "unknown_camera"


class NotARawFile(BadInput):
    type = "not_a_raw_file"


class ChecksumMismatch(BadInput):
    type = "checksum_mismatch"


class UploadTooLarge(StrataError):
    status_code = 413
    type = "upload_too_large"


class Unauthorized(StrataError):
    status_code = 401
    type = "unauthorized"


class NotFound(StrataError):
    status_code = 404
    type = "not_found"


class Conflict(StrataError):
    status_code = 409
    type = "conflict"


class RangeNotSatisfiable(StrataError):
    status_code = 416
    type = "range_not_satisfiable"

    def __init__(self, detail: str, size: int) -> None:
        super().__init__(detail)
        self.size = size
