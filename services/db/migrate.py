"""Run Alembic migrations programmatically (on start and from `strata db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from services.config import get_settings

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", (url or get_settings().resolved_database_url).replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database at ``url`` (default: the configured one) to ``revision``."""
    command.upgrade(alembic_config(url), revision)
