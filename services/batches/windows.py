"""Batch windows: parsing times in the studio's time zone, and where ``now`` falls in a window."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from services.errors import BadInput


class WindowState(StrEnum):
    OPEN = "open"  # shots may be admitted
    WAITING = "waiting"  # not_before is later
    ENDED = "ended"  # not_after passed (skip: the rest is not run)


@dataclass(frozen=True)
class Window:
    not_before: dt.datetime | None
    not_after: dt.datetime | None


def studio_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise BadInput(f"unknown time zone {name!r} (STRATA_TIMEZONE)") from exc


# The times a window may name: later arithmetic (a window moved by days, a job's change cursor) stays in range.
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


def parse_time(value: str | dt.datetime | None, zone: ZoneInfo, what: str) -> dt.datetime | None:
    """An ISO 8601 time as an aware UTC datetime; a time without offset is read in the studio's zone."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise BadInput(f"{what}: {value!r} is not an ISO 8601 time") from exc
    if value.tzinfo is None:
        naive, value = value, value.replace(tzinfo=zone)
        try:
            skipped = value.astimezone(dt.UTC).astimezone(zone).replace(tzinfo=None) != naive
        except OverflowError:
            skipped = False  # years 1 and 9999: refused below
        if skipped:  # in the hour the clocks skip when they go forward (a daylight saving time change)
            gap = (value.replace(fold=1).utcoffset() or dt.timedelta()) - (value.utcoffset() or dt.timedelta())
            raise BadInput(f"{what}: {naive.isoformat(timespec='minutes')} does not exist in {zone.key}: the clocks "
                           f"go forward {abs(gap.total_seconds()) / 3600:g} h that night; give a time outside the "
                           f"time skipped")
    try:
        utc = value.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:30+01:00 and the like
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise BadInput(f"{what}: {value.isoformat()} is outside the years {EARLIEST.year}-{LATEST.year - 1} "
                       f"(UTC)")
    return utc


def make_window(not_before: str | dt.datetime | None, not_after: str | dt.datetime | None, zone: ZoneInfo
                ) -> Window:
    """The window of a new batch; ``BadInput`` when it ends before (or when) it starts."""
    start = parse_time(not_before, zone, "not_before")
    end = parse_time(not_after, zone, "not_after")
    if start is not None and end is not None and end <= start:
        raise BadInput(f"the window ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    return Window(start, end)


def window_state(window: Window, now: dt.datetime) -> WindowState:
    if window.not_after is not None and now >= window.not_after:
        return WindowState.ENDED
    if window.not_before is not None and now < window.not_before:
        return WindowState.WAITING
    return WindowState.OPEN


def next_window(window: Window, now: dt.datetime, zone: ZoneInfo) -> Window:
    """The same clock times (in the studio's zone, so across DST changes too) on the first later day whose
    window has not ended by ``now``."""
    assert window.not_after is not None
    days = 0
    while True:
        days += 1
        end = _shift_days(window.not_after, days, zone)
        if end > now:
            start = None if window.not_before is None else _shift_days(window.not_before, days, zone)
            return Window(start, end)


def _shift_days(value: dt.datetime, days: int, zone: ZoneInfo) -> dt.datetime:
    local = value.astimezone(zone)
    shifted = dt.datetime.combine(local.date() + dt.timedelta(days=days), local.time(), tzinfo=zone)
    return shifted.astimezone(dt.UTC)
