"""Where an embedded service (`strata serve`) is: its API URL and the file holding its token.

Each `strata serve` records them in its own data directory, ``<data-dir>/local-service.json`` (so two services
on one machine never clobber each other); the CLI (`strata submit`, `strata jobs`) and the lab's service
benchmark read the record of the data directory they are given (``--data-dir``, ``STRATA_DATA_DIR``, else
``./var``). A per-user pointer, :data:`LAST_SERVICE_FILE`, names the last service started on this machine and is
used only when no data directory is given and ``./var`` holds no record.
"""

from __future__ import annotations

import json
from pathlib import Path

SERVICE_FILE_NAME = "local-service.json"
LAST_SERVICE_FILE = Path.home() / ".config" / "strata" / "local-service.json"


def service_file(data_dir: Path) -> Path:
    """The record of the service whose data directory is ``data_dir``."""
    return data_dir / SERVICE_FILE_NAME


def remember_local_service(api_url: str, token_file: Path, data_dir: Path, last: bool = True) -> None:
    """Record the service in its data directory (and, with ``last``, as this user's last started service)."""
    record = json.dumps({"api_url": api_url, "token_file": str(token_file.resolve()),
                         "data_dir": str(data_dir.resolve())})
    for path in (service_file(data_dir), *([LAST_SERVICE_FILE] if last else [])):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(record)
        except OSError:
            pass


def _read(path: Path) -> dict[str, str]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def local_service(data_dir: Path | None = None) -> dict[str, str]:
    """The recorded ``{"api_url": ..., "token_file": ..., "data_dir": ...}`` of the service of ``data_dir``;
    without one, of ``./var``, else the last service started here; ``{}`` when none was recorded (or it is
    unreadable)."""
    if data_dir is not None:
        return _read(service_file(data_dir))
    here = Path("var")
    if service_file(here).exists():
        return _read(service_file(here))
    return _read(LAST_SERVICE_FILE)


__all__ = ["LAST_SERVICE_FILE", "local_service", "remember_local_service", "service_file"]
