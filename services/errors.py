"""One error hierarchy for the domain; the API maps it to HTTP in a single handler (api/errors.py).

``type`` is a stable machine-readable slug, ``detail`` a human reason, ``status_code`` what the API answers
when the error reaches it. Errors that end a job (a decode failure, a lost intermediate) are in the same
hierarchy: the job records their ``detail`` as its reason.
"""

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


class ChecksumMismatch(BadInput):
    type = "checksum_mismatch"


class UploadTooLarge(StrataError):
    status_code = 413
    type = "upload_too_large"


class Unauthorized(StrataError):
    status_code = 401
    type = "unauthorized"


class Forbidden(StrataError):
    status_code = 403
    type = "forbidden"


class NotFound(StrataError):
    status_code = 404
    type = "not_found"


class Gone(StrataError):
    """The resource existed but retention removed it (STRATA_RETENTION_DAYS)."""

    status_code = 410
    type = "gone"


class Conflict(StrataError):
    status_code = 409
    type = "conflict"


class RangeNotSatisfiable(StrataError):
    status_code = 416
    type = "range_not_satisfiable"

    def __init__(self, detail: str, size: int) -> None:
        super().__init__(detail)
        self.size = size


class StorageUnavailable(StrataError):
    """The storage backend does not answer or refuses (an object store down, a missing bucket, credentials it
    rejects, a full disk behind it): nobody's fault here, worth a retry later. Workers retry such steps with
    back-off; the API answers 503 with ``Retry-After``."""

    status_code = 503
    type = "storage_unavailable"
    retry_after = 5


class BrokerUnavailable(StrataError):
    """Redis, which holds the heartbeats and the queues, does not answer: nobody's fault here, worth a retry (a 500
    said nothing, and the dashboard kept showing the last rows as if live). The API answers 503 with Retry-After."""

    status_code = 503
    type = "broker_unavailable"
    retry_after = 5


# RAW files ---------------------------------------------------------------------------------------------------


class RawError(StrataError):
    """A RAW file could not be read; ``reason`` is a short human-readable explanation."""

    type = "raw_error"

    @property
    def reason(self) -> str:
        return self.detail


class BadRawFile(RawError):
    """The upload is not a RAW file we can read, or it is truncated or corrupt (the uploader's fault)."""

    status_code = 422
    type = "not_a_raw_file"


class UnsupportedSensor(RawError):
    """A readable RAW whose sensor layout (X-Trans, linear, other CFA) the pipeline does not render."""

    status_code = 422
    type = "unsupported_sensor"


class RawDecodeError(RawError):
    """The decoder crashed, timed out, ran out of memory or reported a failure (fails the job)."""

    type = "decode_failed"


class FramesMismatch(BadInput):
    """The frames of a stack differ in size or CFA pattern."""

    type = "frames_mismatch"


# Intermediates -----------------------------------------------------------------------------------------------


class IntermediateLost(StrataError):
    """An intermediate array a step needs is missing or torn (its host crashed before writing it back); the job
    starts over from its uploads."""

    type = "intermediate_lost"

    def __init__(self, job_id: str, key: str, detail: str) -> None:
        super().__init__(f"intermediate {key} lost: {detail}")
        self.job_id = job_id


class TooManyRequests(StrataError):
    """Refused for a while (failed-auth back-off); ``retry_after`` seconds until the next try may pass."""

    status_code = 429
    type = "too_many_requests"

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after
