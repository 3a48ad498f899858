"""`strata storage`: what the configured storage holds, by kind, and the retention prune (services/jobs/retention)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from services.config import Settings

storage_app = typer.Typer(help="Stored uploads, intermediates and outputs: usage and retention.", no_args_is_help=True)
out = Console()

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ./var or STRATA_DATA_DIR).")]


def _settings(data_dir: Path | None) -> Settings:
    from services.config import get_settings
    from services.storage import get_storage

    if data_dir is not None:
        os.environ["STRATA_DATA_DIR"] = str(data_dir.resolve())
        get_settings.cache_clear()
        get_storage.cache_clear()
    return get_settings()


@contextmanager
def _storage_errors() -> Iterator[None]:
    """The storage unreachable, refusing or without its bucket: one line and exit 1, not a traceback."""
    from services.errors import StorageUnavailable

    try:
        yield
    except StorageUnavailable as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(exc.detail)}")
        raise typer.Exit(1) from None


def _mb(n: int) -> str:
    return f"{n / (1 << 20):,.1f}"


@storage_app.command("usage")
def storage_usage(data_dir: DataDir = None) -> None:
    """Bytes by kind (uploads, intermediates, outputs, this host's scratch cache), from the storage listing."""
    settings = _settings(data_dir)
    from services.jobs.retention import usage
    from services.storage import get_storage

    with _storage_errors():
        totals = usage(get_storage())
    table = Table(title=f"storage: {settings.storage_url or settings.resolved_storage_dir}")
    table.add_column("kind")
    table.add_column("bytes", justify="right")
    table.add_column("MiB", justify="right")
    for kind, n in totals.items():
        table.add_row(kind, str(n), _mb(n))
    out.print(table)


@storage_app.command("prune")
def storage_prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be removed.")] = False,
    older_than: Annotated[float | None, typer.Option("--older-than", help="Days since the job finished "
                                                     "(default STRATA_RETENTION_DAYS).")] = None,
    data_dir: DataDir = None,
) -> None:
    """Remove uploads and outputs of jobs finished longer ago than the retention, and left-behind intermediates."""
    settings = _settings(data_dir)
    from services.db.session import session_scope
    from services.jobs.retention import (
        STALE_PARTIAL_S,
        STALE_UPLOAD_S,
        prune,
        sweep_intermediates,
        sweep_orphan_uploads,
    )
    from services.storage import get_storage

    days = settings.retention_days if older_than is None else older_than
    if days <= 0 and older_than is None:
        out.print("retention is 0 days (keep forever): nothing to prune; give --older-than DAYS")
        raise typer.Exit(0)
    if days < 0:
        out.print("--older-than takes days >= 0 (0: every ended job)")
        raise typer.Exit(2)
    with _storage_errors():
        storage = get_storage()
        with session_scope() as session:
            swept = [] if dry_run else sweep_intermediates(session, storage)
            report = prune(session, storage, older_than_days=days, dry_run=dry_run)
            orphans = [] if dry_run else sweep_orphan_uploads(session, storage, STALE_PARTIAL_S)
        aborted = 0 if dry_run else storage.abort_stale_uploads(STALE_UPLOAD_S)
        aborted += 0 if dry_run else storage.sweep_partials("jobs", STALE_PARTIAL_S)
    verb = "would remove" if dry_run else "removed"
    for job_id in report.jobs:
        out.print(f"{verb} job {job_id}")
    out.print(f"{verb} {len(report.jobs)} job(s), {_mb(report.bytes)} MiB (finished more than {days:g} days ago); "
              f"kept {len(report.kept_referenced)} still referenced; intermediates swept from {len(swept)} job(s)"
              + (f"; removed {aborted} upload(s) left incomplete (cut off, never finished)" if aborted else "")
              + (f"; removed the uploads of {len(orphans)} job(s) never recorded (an API stopped mid-upload)"
                 if orphans else ""))
