"""Storage behind an interface; ``get_storage()`` gives the configured one."""

from __future__ import annotations

from functools import lru_cache

from services.config import get_settings
from services.storage.base import Storage
from services.storage.local import LocalStorage


@lru_cache(maxsize=1)
def get_storage() -> Storage:
    return LocalStorage(get_settings().resolved_storage_dir)


__all__ = ["LocalStorage", "Storage", "get_storage"]
