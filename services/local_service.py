"""Where this machine's embedded service (`strata serve`) is: its API URL and the file holding its token.

`strata serve` records them in :data:`LOCAL_SERVICE_FILE`; the CLI (`strata submit`, `strata jobs`) and the lab's
service benchmark read them back, from any directory on this machine.
"""

from __future__ import annotations

import json
from pathlib import Path

LOCAL_SERVICE_FILE = Path.home() / ".config" / "strata" / "local-service.json"


def remember_local_service(api_url: str, token_file: Path) -> None:
    """Let `strata submit` from any directory on this machine find the embedded service and its token."""
    try:
        LOCAL_SERVICE_FILE.parent.mkdir(parents=True, exist_ok=True)
        LOCAL_SERVICE_FILE.write_text(json.dumps({"api_url": api_url, "token_file": str(token_file.resolve())}))
    except OSError:
        pass


def local_service() -> dict[str, str]:
    """The recorded ``{"api_url": ..., "token_file": ...}``, or ``{}`` when none was recorded (or it is unreadable)."""
    try:
        return dict(json.loads(LOCAL_SERVICE_FILE.read_text()))
    except (OSError, ValueError):
        return {}


__all__ = ["LOCAL_SERVICE_FILE", "local_service", "remember_local_service"]
