"""Storage behind an interface; ``get_storage()`` gives the configured one."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from services.config import Settings, get_settings
from services.storage.base import Storage
from services.storage.local import LocalStorage


def storage_from_settings(settings: Settings) -> Storage:
    """``STRATA_STORAGE_URL``: ``s3://bucket/prefix`` = object storage; ``file:///path`` or unset = local files."""
    url = settings.storage_url or ""
    if url.startswith("s3://"):
        from services.storage.s3 import S3Storage, parse_s3_url
        from services.storage.scratch import ScratchCache

        bucket, prefix = parse_s3_url(url)
        scratch = ScratchCache(settings.resolved_scratch_dir, settings.scratch_mb << 20)
        return S3Storage(bucket, prefix, scratch, part_size=settings.s3_part_mb << 20,
                         create_bucket=settings.s3_create_bucket, public_endpoint=settings.s3_public_endpoint)
    if url.startswith("file://"):
        return LocalStorage(Path(url.removeprefix("file://")), settings.early_sync_s)
    if url:
        raise ValueError(f"STRATA_STORAGE_URL must be s3://bucket/prefix or file:///path, not {url!r}")
    return LocalStorage(settings.resolved_storage_dir, settings.early_sync_s)


@lru_cache(maxsize=1)
def get_storage() -> Storage:
    return storage_from_settings(get_settings())


__all__ = ["LocalStorage", "Storage", "get_storage", "storage_from_settings"]
