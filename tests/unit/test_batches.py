"""Batch rules without a service: windows in the studio's time zone, fairness, the import root, the signature."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from services.batches import webhook
from services.batches.fairness import Candidate, fair_order
from services.batches.paths import raw_files, under_root
from services.batches.windows import Window, WindowState, make_window, next_window, parse_time, window_state
from services.errors import BadInput

PARIS = ZoneInfo("Europe/Paris")
UTC = dt.UTC


def test_naive_times_are_studio_time_and_offsets_are_kept() -> None:
    assert parse_time("2026-12-01T19:00", PARIS, "x") == dt.datetime(2026, 12, 1, 18, 0, tzinfo=UTC)
    assert parse_time("2026-12-01T19:00+02:00", PARIS, "x") == dt.datetime(2026, 12, 1, 17, 0, tzinfo=UTC)
    assert parse_time("2026-12-01T19:00Z", PARIS, "x") == dt.datetime(2026, 12, 1, 19, 0, tzinfo=UTC)
    assert parse_time(None, PARIS, "x") is None
    with pytest.raises(BadInput):
        parse_time("tonight", PARIS, "not_before")


def test_a_studio_time_the_clocks_skip_is_refused_saying_so() -> None:
    """Found from outside: 02:30-03:30 on the night the clocks go forward was refused as "the window ends
    (01:30Z) before it starts (01:30Z)"; an hour that happens twice (autumn) takes its first pass."""
    with pytest.raises(BadInput, match=r"not_before: 2027-03-28T02:30 does not exist in Europe/Paris: the clocks go "
                                       r"forward 1 h that night"):
        make_window("2027-03-28T02:30", "2027-03-28T03:30", PARIS)
    assert parse_time("2027-10-31T02:30", PARIS, "x") == dt.datetime(2027, 10, 31, 0, 30, tzinfo=UTC)
    assert parse_time("2027-03-28T02:30+01:00", PARIS, "x") == dt.datetime(2027, 3, 28, 1, 30, tzinfo=UTC)


def test_a_window_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(BadInput, match="ends"):
        make_window("2026-12-02T07:00", "2026-12-01T19:00", PARIS)
    with pytest.raises(BadInput):
        make_window("2026-12-01T19:00", "2026-12-01T19:00", PARIS)
    w = make_window("2026-12-01T19:00", "2026-12-02T07:00", PARIS)  # overnight, across midnight
    assert w.not_after - w.not_before == dt.timedelta(hours=12)


def test_window_states() -> None:
    w = Window(dt.datetime(2026, 12, 1, 18, tzinfo=UTC), dt.datetime(2026, 12, 2, 6, tzinfo=UTC))
    assert window_state(w, dt.datetime(2026, 12, 1, 17, tzinfo=UTC)) == WindowState.WAITING
    assert window_state(w, dt.datetime(2026, 12, 1, 18, tzinfo=UTC)) == WindowState.OPEN
    assert window_state(w, dt.datetime(2026, 12, 2, 6, tzinfo=UTC)) == WindowState.ENDED
    assert window_state(Window(None, None), dt.datetime(2030, 1, 1, tzinfo=UTC)) == WindowState.OPEN
    assert window_state(Window(None, w.not_after), dt.datetime(2026, 12, 1, tzinfo=UTC)) == WindowState.OPEN


def test_wait_moves_the_window_to_the_same_studio_times_next_day_across_dst() -> None:
    # 19:00-07:00 Paris on the night of the DST change (29 March 2026, clocks go forward at 02:00).
    w = make_window("2026-03-27T19:00", "2026-03-28T07:00", PARIS)
    moved = next_window(w, dt.datetime(2026, 3, 28, 8, tzinfo=UTC), PARIS)
    assert moved.not_before.astimezone(PARIS).time() == dt.time(19, 0)
    assert moved.not_after.astimezone(PARIS).time() == dt.time(7, 0)
    assert moved.not_before.astimezone(PARIS).date() == dt.date(2026, 3, 28)
    assert moved.not_after - moved.not_before == dt.timedelta(hours=11)  # one hour shorter that night
    # Days missed altogether (the service was off): the first window not yet over.
    later = next_window(w, dt.datetime(2026, 4, 2, 12, tzinfo=UTC), PARIS)
    assert later.not_after.astimezone(PARIS) == dt.datetime(2026, 4, 3, 7, 0, tzinfo=PARIS)


def _c(job: str, station: str, minute: int) -> Candidate:
    return Candidate(job, station, dt.datetime(2026, 12, 1, 19, minute, tzinfo=UTC))


def test_fairness_is_round_robin_across_stations_oldest_first_within() -> None:
    big = [_c(f"a{i}", "A", i) for i in range(50)]  # station A queued 50 shots first
    small = [_c(f"b{i}", "B", 55 + i) for i in range(3)]
    order = [c.job_id for c in fair_order(big + small, {}, 6)]
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert [c.job_id for c in fair_order(big + small, {}, 100)][-1] == "a49"


def test_fairness_holds_across_passes_from_the_last_admission() -> None:
    big = [_c(f"a{i}", "A", i) for i in range(50)]
    small = [_c(f"b{i}", "B", 55 + i) for i in range(3)]
    t = dt.datetime(2026, 12, 1, 20, tzinfo=UTC)
    # One slot per pass: A was served last, so B goes next, then A again.
    assert fair_order(big + small, {"A": t, "B": t - dt.timedelta(seconds=1)}, 1)[0].job_id == "b0"
    assert fair_order(big + small, {"A": t - dt.timedelta(seconds=1), "B": t}, 1)[0].job_id == "a0"
    assert fair_order(big + small, {"A": t}, 1)[0].job_id == "b0"  # never served goes first


def test_paths_must_be_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "import"
    (root / "night" / ".hidden").mkdir(parents=True)
    for name in ("a.dng", "b.IIQ", "notes.txt"):
        (root / "night" / name).write_bytes(b"x")
    (root / "night" / ".hidden" / "c.dng").write_bytes(b"x")
    outside = tmp_path / "secret.dng"
    outside.write_bytes(b"x")
    os.symlink(outside, root / "night" / "link.dng")
    assert under_root(root, "night") == (root / "night").resolve()
    for bad in ("../secret.dng", str(outside), "night/../../secret.dng"):
        with pytest.raises(BadInput, match="outside"):
            under_root(root, bad)
    with pytest.raises(BadInput, match="outside"):  # a symlink that leads out, inside a folder
        raw_files(root, ["night"])
    (root / "night" / "link.dng").unlink()
    assert [p.name for p in raw_files(root, ["night", "night/a.dng"])] == ["a.dng", "b.IIQ"]
    with pytest.raises(BadInput, match="import root"):
        under_root(None, "night")
    with pytest.raises(BadInput, match="does not exist"):
        under_root(root, "nope")


def test_signature_is_hmac_sha256_of_the_raw_body() -> None:
    body = webhook.payload({"id": "b1", "counts": {"done": 2}})
    assert json.loads(body) == {"event": "batch.finished", "batch": {"id": "b1", "counts": {"done": 2}},
                                "report_url": "/v1/batches/b1/report"}
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert webhook.sign("s3cret", body) == f"sha256={expected}"
    assert webhook.verify("s3cret", body, f"sha256={expected}")
    assert not webhook.verify("other", body, f"sha256={expected}")
    assert not webhook.verify("s3cret", body + b" ", f"sha256={expected}")


@pytest.mark.parametrize("url", ["ftp://x/y", "file:///etc/passwd", "javascript:alert(1)", "http://"])
def test_webhook_urls_must_be_http(url: str) -> None:
    with pytest.raises(BadInput):
        webhook.check_url(url)
    assert webhook.check_url(" https://hooks.example/strata ") == "https://hooks.example/strata"


@pytest.mark.parametrize("url", [
    "http://2852039166/latest/meta-data/", "http://0xa9fea9fe/", "http://169.254.43518/",  # 169.254.169.254
    "http://[::ffff:169.254.169.254]/", "http://0:8199/", "http://127.0.0.1:6379/", "http://[::1]/",
    "http://2130706433:8199/", "http://240.0.0.1/"])
def test_webhooks_to_the_server_itself_or_a_metadata_service_are_refused(url: str) -> None:
    """Found from outside: numeric forms and IPv4-mapped addresses got round the check; loopback was allowed
    (a batch could make the coordinator POST to Redis and report what it saw)."""
    with pytest.raises(BadInput):
        webhook.check_url(url)


def test_webhook_hosts_are_checked_where_they_resolve() -> None:
    assert webhook.check_url("http://10.1.2.3/hook") == "http://10.1.2.3/hook"  # the studio's network
    assert webhook.check_url("http://127.0.0.1:9/x", allow_loopback=True) == "http://127.0.0.1:9/x"
    assert "refused: localhost resolves to a loopback address" in (webhook.refused_address("http://localhost:6379/")
                                                                   or "")
    assert webhook.refused_address("http://localhost:6379/", allow_loopback=True) is None
    assert webhook.refused_address("http://10.1.2.3/hook") is None
    assert webhook.refused_address("http://no-such-host.invalid/") is None  # the delivery's own error says it
