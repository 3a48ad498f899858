"""What a batch did: counts, throughput and ETA, and the per-shot report (JSON rows or CSV)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass

from services.batches.service import Tally, elapsed_s, shot_status
from services.batches.states import NOT_RUN
from services.db.models import Batch, Job, as_utc, utcnow
from services.jobs.states import JobStatus

COUNT_KEYS = (*(s.value for s in JobStatus), NOT_RUN)
CSV_COLUMNS = ("job", "name", "status", "outputs", "urls", "sha256", "bytes", "error", "queued_at", "started_at",
               "finished_at", "seconds")


@dataclass(frozen=True)
class OutputRow:
    name: str
    url: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class ShotRow:
    job: str
    name: str
    status: str
    outputs: list[OutputRow]
    error: str | None
    queued_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    seconds: float | None


@dataclass(frozen=True)
class Progress:
    counts: dict[str, int]
    total: int
    shots_per_minute: float | None
    eta: dt.datetime | None


def progress(batch: Batch, tally: Tally, now: dt.datetime | None = None) -> Progress:
    """Counts by shot status; shots done per minute since the batch started; the ETA of the rest at that pace."""
    now = now or utcnow()
    counts = dict.fromkeys(COUNT_KEYS, 0) | tally.counts
    rate = None
    if batch.started_at and tally.last_done_at and tally.done_finished:
        minutes = (as_utc(tally.last_done_at) - as_utc(batch.started_at)).total_seconds() / 60
        rate = round(tally.done_finished / minutes, 3) if minutes > 0 else None
    left = counts[JobStatus.QUEUED] + counts[JobStatus.RUNNING]
    eta = None
    if rate and left:
        start = max(now, as_utc(batch.not_before)) if batch.not_before else now
        eta = start + dt.timedelta(minutes=left / rate)
    return Progress(counts, sum(tally.counts.values()), rate, eta)


def shot_rows(jobs: list[Job]) -> list[ShotRow]:
    """Every shot of the batch, in the order they were added, failed and not-run ones included."""
    return [ShotRow(
        job=j.id, name=(j.frames[0].original_name or j.frames[0].name) if j.frames else "", status=shot_status(j),
        outputs=[OutputRow(o.name, f"/v1/jobs/{j.id}/outputs/{o.name}", o.sha256, o.bytes) for o in j.outputs],
        error=j.error, queued_at=as_utc(j.created_at), started_at=j.started_at and as_utc(j.started_at),
        finished_at=j.finished_at and as_utc(j.finished_at), seconds=elapsed_s(j.started_at, j.finished_at),
    ) for j in jobs]


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: object) -> object:
    """A text cell a spreadsheet would run as a formula (``=HYPERLINK(…)`` in a file name) gets a leading ``'``
    (OWASP's CSV injection advice): found from outside in the report's name column."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def report_csv(rows: list[ShotRow]) -> str:
    """One line per shot; several outputs are joined with ``;`` in the same order in every output column."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([_cell(v) for v in [
            r.job, r.name, r.status, ";".join(o.name for o in r.outputs), ";".join(o.url for o in r.outputs),
            ";".join(o.sha256 for o in r.outputs), ";".join(str(o.bytes) for o in r.outputs), r.error or "",
            _iso(r.queued_at), _iso(r.started_at) or "", _iso(r.finished_at) or "",
            "" if r.seconds is None else r.seconds,
        ]])
    return buf.getvalue()


def _iso(value: dt.datetime | None) -> str | None:
    """UTC as the JSON API writes it (``2026-12-01T19:00:00Z``), in the CSV and the webhook too."""
    return None if value is None else as_utc(value).isoformat().replace("+00:00", "Z")


def summary(batch: Batch, tally: Tally, now: dt.datetime | None = None) -> dict[str, object]:
    """The batch as the API and the webhook show it (JSON-ready)."""
    p = progress(batch, tally, now)
    return {
        "id": batch.id, "name": batch.name, "status": batch.status, "recipes": list(batch.recipes),
        "priority": batch.priority, "not_before": _iso(batch.not_before), "not_after": _iso(batch.not_after),
        "on_window_end": batch.on_window_end, "sealed": batch.sealed is not False, "counts": p.counts, "total": p.total,
        "shots_per_minute": p.shots_per_minute, "eta": _iso(p.eta), "webhook_url": batch.webhook_url,
        "webhook": {"attempts": batch.webhook_attempts, "last_status": batch.webhook_status,
                    "delivered_at": _iso(batch.webhook_delivered_at)},
        "created_at": _iso(batch.created_at), "started_at": _iso(batch.started_at),
        "finished_at": _iso(batch.finished_at),
    }
