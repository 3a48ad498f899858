"""The `strata` commands against a fake API over real HTTP: exit codes, choice validation, --version, --json,
the batch commands, and the hot folder's sending, remembering and collecting. (The real service: tests/e2e.)"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli.main import app
from cli.watch import STATE_NAME, Watcher
from tests.unit.fake_api import FakeApi, Seen, fake_api, job

runner = CliRunner()
TIFF = b"II*\x00" + b"t" * 100
OUTPUT = {"name": "a.tif", "url": "/v1/jobs/j1/outputs/a.tif", "sha256": hashlib.sha256(TIFF).hexdigest(),
          "bytes": len(TIFF)}


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with fake_api() as fake:
        yield fake


def _auth(api: FakeApi) -> list[str]:
    return ["--api", api.url, "--token", "tok"]


def _raw(path: Path, data: bytes = b"II*\x00raw") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_version_prints_the_package_version_and_exits_0() -> None:
    from importlib.metadata import version

    done = runner.invoke(app, ["--version"])
    assert done.exit_code == 0 and done.stdout.strip() == f"strata {version('strata')}"


def test_static_choices_are_listed_in_help_and_refused_with_exit_2(tmp_path: Path) -> None:
    f = _raw(tmp_path / "a.dng")
    helped = runner.invoke(app, ["submit", "--help"], terminal_width=200)
    assert helped.exit_code == 0 and "interactive|batch" in helped.output and "iq3_s|iq2_xs" in helped.output
    bad = runner.invoke(app, ["submit", str(f), "--priority", "urgent", "--token", "t"])
    assert bad.exit_code == 2 and "interactive" in bad.output and "batch" in bad.output
    bad_camera = runner.invoke(app, ["submit", str(f), "--camera", "IQ4", "--token", "t"])
    assert bad_camera.exit_code == 2 and "iq3_s" in bad_camera.output.lower()
    empty = runner.invoke(app, ["submit", str(tmp_path / "nothing"), "--token", "t"])
    assert empty.exit_code == 2
    negative = runner.invoke(app, ["submit", str(f), "--timeout", "-5", "--token", "t"])  # was uploaded, then exit 1
    assert negative.exit_code == 2


def test_no_raw_file_in_the_folders_is_bad_usage(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    done = runner.invoke(app, ["submit", str(tmp_path), "--token", "t"])
    assert done.exit_code == 2 and "no RAW files" in done.output


def test_unreachable_api_says_so_retries_and_exits_3() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    done = runner.invoke(app, ["--retry-for", "1.5", "jobs", "list", "--api", url, "--token", "t"])
    assert done.exit_code == 3, done.output
    assert time.monotonic() - start < 10
    assert done.output.count(f"cannot reach the Strata API at {url}") >= 2 and "retrying" in done.output


def test_a_refused_token_exits_4(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs", (401, {"type": "unauthorized", "detail": "unknown token"}))
    done = runner.invoke(app, ["jobs", "list", *_auth(api)])
    assert done.exit_code == 4 and "unauthorized" in done.output


def test_a_5xx_is_retried_like_an_outage(api: FakeApi) -> None:
    answers = iter([(503, {"type": "unavailable", "detail": "restarting"}), (200, {"jobs": [], "next_cursor": None})])
    api.route("GET", "/v1/jobs", lambda s: next(answers))
    done = runner.invoke(app, ["jobs", "list", "--json", *_auth(api)])
    assert done.exit_code == 0 and json.loads(done.stdout) == {"jobs": [], "next_cursor": None}


def test_jobs_list_and_show_print_the_api_json(api: FakeApi) -> None:
    one = job("j1", "done", outputs=[OUTPUT])
    body = {"jobs": [one], "next_cursor": None}
    api.route("GET", "/v1/jobs", (200, body))
    api.route("GET", "/v1/jobs/j1", (200, one))
    listed = runner.invoke(app, ["jobs", "list", "--json", "--status", "done", *_auth(api)])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == body
    assert api.calls("GET", "/v1/jobs")[0].query == "limit=20&status=done"
    shown = runner.invoke(app, ["jobs", "show", "j1", "--json", *_auth(api)])
    assert shown.exit_code == 0 and json.loads(shown.stdout) == one


def test_jobs_and_batch_lists_go_on_with_the_cursor_their_end_names(api: FakeApi) -> None:
    """Thousands of jobs and hundreds of batches are more than a page: the table's end (on stderr) says how to go
    on, and --cursor asks for the next page (found from outside: only the newest page could be listed)."""
    api.route("GET", "/v1/jobs", lambda s: (200, {"jobs": [job("j2" if "cursor" in s.query else "j1", "done")],
                                                  "next_cursor": None if "cursor" in s.query else "Zm9v"}))
    first = runner.invoke(app, ["jobs", "list", "--limit", "1", "--status", "done", *_auth(api)], terminal_width=200)
    assert first.exit_code == 0 and "j1" in first.stdout and "more" not in first.stdout
    assert "more: strata jobs list --limit 1 --status done --cursor Zm9v" in first.stderr
    rest = runner.invoke(app, ["jobs", "list", "--limit", "1", "--status", "done", "--cursor", "Zm9v", *_auth(api)],
                         terminal_width=200)
    assert rest.exit_code == 0 and "j2" in rest.stdout and "more:" not in rest.stderr
    assert api.calls("GET", "/v1/jobs")[-1].query == "limit=1&status=done&cursor=Zm9v"
    batch = {"id": "b1", "name": "night", "status": "done", "counts": {"done": 3}}
    api.route("GET", "/v1/batches", (200, {"batches": [batch], "next_cursor": "YmFy"}))
    listed = runner.invoke(app, ["batch", "list", "--limit", "1", *_auth(api)], terminal_width=200)
    assert listed.exit_code == 0 and "more: strata batch list --limit 1 --cursor YmFy" in listed.stderr
    runner.invoke(app, ["batch", "list", "--cursor", "YmFy", *_auth(api)])
    assert api.calls("GET", "/v1/batches")[-1].query == "limit=50&cursor=YmFy"


def _serve_jobs(api: FakeApi, final: dict[str, str]) -> None:
    """POST /v1/jobs answers jobs j1, j2, ...; each GET answers its ``final`` status (done with an output)."""
    count = iter(range(1, 100))

    def post(seen: Seen) -> tuple[int, Any]:
        return 202, job(f"j{next(count)}")

    api.route("POST", "/v1/jobs", post)
    for job_id, status in final.items():
        out = [{**OUTPUT, "url": f"/v1/jobs/{job_id}/outputs/a.tif"}] if status == "done" else []
        api.route("GET", f"/v1/jobs/{job_id}", (200, job(job_id, status, outputs=out,
                                                             error="boom" if status == "failed" else None)))
        api.route("GET", f"/v1/jobs/{job_id}/outputs/a.tif", (200, TIFF))


def test_submit_a_folder_json_one_object_per_shot_and_outputs_mirror_the_folders(api: FakeApi, tmp_path: Path
                                                                                ) -> None:
    _raw(tmp_path / "in" / "x" / "a.dng")
    _raw(tmp_path / "in" / "y" / "a.dng")
    _serve_jobs(api, {"j1": "done", "j2": "done"})
    done = runner.invoke(app, ["submit", str(tmp_path / "in"), "--json", "--out", str(tmp_path / "out"),
                               "--priority", "batch", *_auth(api)])
    assert done.exit_code == 0, done.output
    shots = json.loads(done.stdout)
    assert [(s["job"], s["status"]) for s in shots] == [("j1", "done"), ("j2", "done")]
    assert shots[0]["paths"] == [str(tmp_path / "out" / "x" / "a.tif")]
    assert (tmp_path / "out" / "y" / "a.tif").read_bytes() == TIFF
    posted = api.calls("POST", "/v1/jobs")[0].body
    assert b'name="priority"\r\n\r\nbatch' in posted and b'name="recipe"' not in posted
    assert hashlib.sha256(b"II*\x00raw").hexdigest().encode() in posted


def test_submit_exits_1_when_a_job_fails_and_reports_it(api: FakeApi, tmp_path: Path) -> None:
    _raw(tmp_path / "a.dng")
    _raw(tmp_path / "b.dng")
    _serve_jobs(api, {"j1": "done", "j2": "failed"})
    done = runner.invoke(app, ["submit", str(tmp_path), "--json", "--out", str(tmp_path / "out"), *_auth(api)])
    assert done.exit_code == 1
    shots = json.loads(done.stdout)
    assert [s["status"] for s in shots] == ["done", "failed"] and shots[1]["error"] == "boom"


def test_submit_no_wait_prints_queued_jobs(api: FakeApi, tmp_path: Path) -> None:
    _raw(tmp_path / "a.dng")
    _serve_jobs(api, {})
    done = runner.invoke(app, ["submit", str(tmp_path), "--no-wait", "--json", *_auth(api)])
    assert done.exit_code == 0 and json.loads(done.stdout)[0]["status"] == "queued"


def test_recipes_are_checked_against_the_service_when_it_lists_them(api: FakeApi, tmp_path: Path) -> None:
    f = _raw(tmp_path / "a.dng")
    _serve_jobs(api, {})
    unlisted = runner.invoke(app, ["submit", str(f), "--recipe", "tiff16", "--recipe", "jpeg-proof", "--no-wait",
                                   *_auth(api)])  # no GET /v1/recipes (404): no check, both sent
    assert unlisted.exit_code == 0, unlisted.output
    assert api.calls("POST", "/v1/jobs")[0].body.count(b'name="recipe"') == 2
    api.route("GET", "/v1/recipes", (200, {"recipes": [{"name": "tiff16"}, {"name": "jpeg-proof"}]}))
    bad = runner.invoke(app, ["submit", str(f), "--recipe", "tiff8", "--no-wait", *_auth(api)])
    assert bad.exit_code == 2 and "unknown recipe tiff8" in bad.output and "tiff16, jpeg-proof" in bad.output
    assert len(api.calls("POST", "/v1/jobs")) == 1


def test_batch_create_posts_the_batch_then_uploads_each_shot(api: FakeApi, tmp_path: Path) -> None:
    for i in range(3):
        _raw(tmp_path / f"s_{i:02d}.dng")
    api.route("POST", "/v1/batches", (201, {"id": "b1", "status": "waiting", "sealed": False, "counts": {}}))
    api.route("POST", "/v1/batches/b1/shots", lambda s: (202, job(f"j{len(api.seen)}")))
    api.route("POST", "/v1/batches/b1/seal", (200, {"id": "b1", "status": "running", "sealed": True, "counts": {}}))
    done = runner.invoke(app, ["batch", "create", "night", str(tmp_path), "--recipe", "tiff16", "--priority",
                               "batch", "--not-before", "2026-12-01T22:00+01:00", "--webhook",
                               "https://dam.example/hook", "--json", *_auth(api)])
    assert done.exit_code == 0, done.output
    assert api.calls("POST", "/v1/batches")[0].json() == {
        "name": "night", "recipes": ["tiff16"], "priority": "batch", "not_before": "2026-12-01T22:00+01:00",
        "webhook_url": "https://dam.example/hook", "sealed": False}  # open while the uploads go on
    assert len(api.calls("POST", "/v1/batches/b1/shots")) == 3
    assert [c.path for c in api.seen if c.method == "POST"][-1] == "/v1/batches/b1/seal"  # sealed after them
    body = json.loads(done.stdout)
    assert body["batch"]["sealed"] is True and [s["status"] for s in body["shots"]] == ["queued"] * 3


def test_batch_create_against_a_release_before_sealing_does_not_seal(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: a station newer than its server (a release before sealing, whose batches say nothing
    of `sealed` and end by themselves) warned that the batch "will not end before strata batch seal" (the seal
    route is unknown there: 404). No seal is sent to such a server."""
    _raw(tmp_path / "a.dng")
    api.route("POST", "/v1/batches", (201, {"id": "b1", "status": "waiting", "total": 0, "counts": {}}))
    api.route("POST", "/v1/batches/b1/shots", lambda s: (202, job("j1")))
    done = runner.invoke(app, ["batch", "create", "night", str(tmp_path), "--json", *_auth(api)])
    assert done.exit_code == 0, done.output
    assert not api.calls("POST", "/v1/batches/b1/seal") and "seal" not in done.stderr


def test_batch_create_with_no_shot_uploaded_cancels_its_empty_batch(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: `strata batch create NAME DIR` whose every upload was refused (422) or interrupted
    before the first one arrived sealed a batch of no shots, which waits for shots and so stayed `open` for good
    (no webhook; `batch download --wait` waited a day). None uploaded: the batch is cancelled after its seal."""
    _raw(tmp_path / "broken.dng")
    api.route("POST", "/v1/batches", (201, {"id": "b1", "status": "open", "sealed": False, "total": 0, "counts": {}}))
    api.route("POST", "/v1/batches/b1/shots", (422, {"type": "not_a_raw_file", "detail": "not a RAW file"}))
    api.route("POST", "/v1/batches/b1/seal", (200, {"id": "b1", "status": "open", "sealed": True, "total": 0,
                                                    "counts": {}}))
    api.route("POST", "/v1/batches/b1/cancel", (200, {"id": "b1", "status": "cancelled", "sealed": True,
                                                      "total": 0, "counts": {}}))
    done = runner.invoke(app, ["batch", "create", "night", str(tmp_path), "--json", *_auth(api)])
    assert done.exit_code == 1, done.output  # its shot was refused
    assert [c.path for c in api.seen if c.method == "POST"][-2:] == ["/v1/batches/b1/seal", "/v1/batches/b1/cancel"]
    assert json.loads(done.stdout)["batch"]["status"] == "cancelled"


def test_batch_create_with_a_shot_uploaded_does_not_cancel(api: FakeApi, tmp_path: Path) -> None:
    _raw(tmp_path / "a.dng")
    api.route("POST", "/v1/batches", (201, {"id": "b1", "status": "open", "sealed": False, "total": 0, "counts": {}}))
    api.route("POST", "/v1/batches/b1/shots", lambda s: (202, job("j1")))
    api.route("POST", "/v1/batches/b1/seal", (200, {"id": "b1", "status": "running", "sealed": True, "total": 1,
                                                    "counts": {}}))
    done = runner.invoke(app, ["batch", "create", "night", str(tmp_path), "--json", *_auth(api)])
    assert done.exit_code == 0, done.output
    assert not api.calls("POST", "/v1/batches/b1/cancel")


def test_batch_create_refuses_bad_times_and_webhooks_before_calling(api: FakeApi, tmp_path: Path) -> None:
    f = _raw(tmp_path / "a.dng")
    late = runner.invoke(app, ["batch", "create", "n", str(f), "--not-after", "tonight", *_auth(api)])
    assert late.exit_code == 2 and "ISO 8601" in late.output
    hook = runner.invoke(app, ["batch", "create", "n", str(f), "--webhook", "ftp://x", *_auth(api)])
    assert hook.exit_code == 2 and "http(s)" in hook.output
    empty = runner.invoke(app, ["batch", "create", "n", *_auth(api)])
    assert empty.exit_code == 2 and api.seen == []


def test_batch_status_list_report_cancel(api: FakeApi, tmp_path: Path) -> None:
    batch = {"id": "b1", "name": "night", "status": "running", "counts": {"done": 3, "queued": 2}, "eta": "07:00"}
    api.route("GET", "/v1/batches/b1", (200, batch))
    api.route("GET", "/v1/batches", (200, {"batches": [batch]}))
    report = {"batch": batch, "shots": [{"job": "j1", "status": "done", "outputs": [], "error": None}]}
    api.route("GET", "/v1/batches/b1/report",
              lambda s: (200, "job,status\r\nj1,done\r\n") if s.query == "format=csv" else (200, report))
    api.route("POST", "/v1/batches/b1/cancel", (200, {**batch, "status": "cancelled"}))
    status = runner.invoke(app, ["batch", "status", "b1", *_auth(api)], terminal_width=200)
    assert status.exit_code == 0 and "done 3, queued 2" in status.stdout and "07:00" in status.stdout
    assert json.loads(runner.invoke(app, ["batch", "status", "b1", "--json", *_auth(api)]).stdout) == batch
    listed = runner.invoke(app, ["batch", "list", "--json", *_auth(api)])
    assert json.loads(listed.stdout) == {"batches": [batch]}
    table = runner.invoke(app, ["batch", "list", *_auth(api)], terminal_width=200)
    assert "night" in table.stdout and "running" in table.stdout
    assert json.loads(runner.invoke(app, ["batch", "report", "b1", *_auth(api)]).stdout) == report
    csv_out = tmp_path / "r.csv"
    got = runner.invoke(app, ["batch", "report", "b1", "--format", "csv", "--out", str(csv_out), *_auth(api)])
    assert got.exit_code == 0 and csv_out.read_bytes() == b"job,status\r\nj1,done\r\n"
    cancelled = runner.invoke(app, ["batch", "cancel", "b1", *_auth(api)])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.stdout
    missing = runner.invoke(app, ["batch", "status", "nope", *_auth(api)])
    assert missing.exit_code == 1 and "404" in missing.output


def test_batch_download_saves_the_rendered_shots_and_names_the_rest(api: FakeApi, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--wait polls until the batch ends; each done shot's outputs are saved (two of one name both kept), a failed
    shot is named and makes the exit 1; a second run keeps the files already there and fetches nothing new."""
    monkeypatch.setattr("cli.station.time.sleep", lambda s: None)
    states = iter(["running", "done"])
    api.route("GET", "/v1/batches/b1", lambda s: (200, {"id": "b1", "status": next(states, "done"), "total": 3,
                                                        "counts": {"done": 2, "failed": 1}}))
    shots = [{"job": j, "name": "a.dng", "status": "done", "error": None,
              "outputs": [{**OUTPUT, "url": f"/v1/jobs/{j}/outputs/a.tif"}]} for j in ("j1", "j2")]
    shots.append({"job": "j3", "name": "c.dng", "status": "failed", "outputs": [], "error": "decode failed: boom"})
    api.route("GET", "/v1/batches/b1/report", (200, {"batch": {"id": "b1"}, "shots": shots}))
    for j in ("j1", "j2"):
        api.route("GET", f"/v1/jobs/{j}/outputs/a.tif", (200, TIFF))
    got = runner.invoke(app, ["batch", "download", "b1", "--wait", "--out", str(tmp_path), *_auth(api)])
    assert got.exit_code == 1, got.output
    assert got.stdout.split() == [str(tmp_path / "a.tif"), str(tmp_path / "a_2.tif")]
    assert "c.dng: failed: decode failed: boom" in got.stderr
    assert (tmp_path / "a.tif").read_bytes() == TIFF == (tmp_path / "a_2.tif").read_bytes()
    assert len(api.calls("GET", "/v1/batches/b1")) == 2  # running, then done
    before = (tmp_path / "a.tif").stat().st_mtime_ns
    again = runner.invoke(app, ["batch", "download", "b1", "--out", str(tmp_path), *_auth(api)])
    assert again.exit_code == 1 and (tmp_path / "a.tif").stat().st_mtime_ns == before  # kept, not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tif", "a_2.tif"]


def test_batch_download_run_again_never_overwrites_another_shots_file(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: a stack (first in the report) still running when the batch was first downloaded; its
    same-named single was saved as frame_00.tif; the second run saved the stack over it and fetched the single
    again as frame_00_2.tif. Files saved stay as they are; the newcomer takes the next free name."""
    stack_tiff = b"II*\x00" + b"s" * 90
    stack = {"job": "j1", "name": "frame_00.dng", "status": "running", "error": None, "outputs": []}
    single = {"job": "j2", "name": "frame_00.dng", "status": "done", "error": None,
              "outputs": [{**OUTPUT, "url": "/v1/jobs/j2/outputs/frame_00.tif", "name": "frame_00.tif"}]}
    api.route("GET", "/v1/batches/b1/report", (200, {"batch": {"id": "b1"}, "shots": [stack, single]}))
    api.route("GET", "/v1/jobs/j2/outputs/frame_00.tif", (200, TIFF))
    first = runner.invoke(app, ["batch", "download", "b1", "--out", str(tmp_path), *_auth(api)])
    assert first.exit_code == 1 and (tmp_path / "frame_00.tif").read_bytes() == TIFF
    stack.update(status="done", outputs=[{"name": "frame_00.tif", "url": "/v1/jobs/j1/outputs/frame_00.tif",
                                          "sha256": hashlib.sha256(stack_tiff).hexdigest(), "bytes": len(stack_tiff)}])
    api.route("GET", "/v1/jobs/j1/outputs/frame_00.tif", (200, stack_tiff))
    for _ in range(2):  # and a third run changes nothing
        again = runner.invoke(app, ["batch", "download", "b1", "--out", str(tmp_path), *_auth(api)])
        assert again.exit_code == 0, again.output
        assert (tmp_path / "frame_00.tif").read_bytes() == TIFF and (tmp_path / "frame_00_2.tif").read_bytes() == \
            stack_tiff
        assert sorted(p.name for p in tmp_path.iterdir()) == ["frame_00.tif", "frame_00_2.tif"]
    assert len(api.calls("GET", "/v1/jobs/j2/outputs/frame_00.tif")) == 3


def test_batch_download_mirrors_the_folders_of_imported_shots(api: FakeApi, tmp_path: Path) -> None:
    shots = [{"job": j, "name": name, "status": "done", "error": None,
              "outputs": [{**OUTPUT, "url": f"/v1/jobs/{j}/outputs/a.tif"}]}
             for j, name in (("j1", "night/x/a.dng"), ("j2", "night/y/a.dng"), ("j3", "../../a.dng"))]
    api.route("GET", "/v1/batches/b1/report", (200, {"batch": {"id": "b1"}, "shots": shots}))
    for j in ("j1", "j2", "j3"):
        api.route("GET", f"/v1/jobs/{j}/outputs/a.tif", (200, TIFF))
    got = runner.invoke(app, ["batch", "download", "b1", "--out", str(tmp_path), *_auth(api)])
    assert got.exit_code == 0, got.output
    assert got.stdout.split() == [str(tmp_path / "night/x/a.tif"), str(tmp_path / "night/y/a.tif"),
                                  str(tmp_path / "a.tif")]


def test_an_out_folder_that_cannot_be_written_is_a_usage_error_before_anything_is_sent(api: FakeApi,
                                                                                        tmp_path: Path) -> None:
    _serve_jobs(api, {"j1": "done"})
    _raw(tmp_path / "in" / "a.dng")
    blocked = _raw(tmp_path / "a-file") / "out"  # a folder under a file cannot be made
    for args in (["submit", str(tmp_path / "in")], ["jobs", "download", "j1"], ["batch", "download", "b1"],
                 ["watch", str(tmp_path / "in"), "--once"]):
        got = runner.invoke(app, [*args, "--out", str(blocked), *_auth(api)])
        said = " ".join(got.output.split())
        assert got.exit_code == 2 and f"--out {blocked} cannot be used: Not a directory" in said, (args, said)
    assert api.calls("POST", "/v1/jobs") == []


def test_jobs_remove_files(api: FakeApi) -> None:
    api.route("DELETE", "/v1/jobs/j1/files", (200, {**job("j1", "done"), "files_removed_at": "2026-12-04T13:00:00Z"}))
    refusal = {"type": "conflict", "title": "Conflict", "detail": "job j2 is running: cancel it before removing it"}
    api.route("DELETE", "/v1/jobs/j2/files", (409, refusal))
    done = runner.invoke(app, ["jobs", "remove-files", "j1", *_auth(api)])
    assert done.exit_code == 0 and "files removed at 2026-12-04T13:00:00Z" in done.stdout
    refused = runner.invoke(app, ["jobs", "remove-files", "j2", *_auth(api)])
    assert refused.exit_code != 0 and "cancel it" in refused.output


def _watcher(api: FakeApi, root: Path, clock: list[float], **kwargs: Any) -> Watcher:
    client = httpx.Client(base_url=api.url, headers={"Authorization": "Bearer tok"})
    return Watcher(root, client, Console(file=io.StringIO()), fields={"camera": None, "recipes": [],
                                                                      "priority": None},
                   settle=2.0, clock=lambda: clock[0], **kwargs)


def _settle(watcher: Watcher, clock: list[float]) -> int:
    watcher.poll()
    clock[0] += 2.5
    return watcher.poll()


def test_watch_sends_a_file_once_and_a_restart_resends_nothing(api: FakeApi, tmp_path: Path) -> None:
    _serve_jobs(api, {"j1": "done", "j2": "running"})
    a = _raw(tmp_path / "a.dng")
    clock = [1000.0]
    w = _watcher(api, tmp_path, clock)
    assert w.poll() == 0 and api.calls("POST", "/v1/jobs") == []  # seen once: not yet known complete
    clock[0] += 2.5
    assert w.poll() == 1 and _settle(w, clock) == 0  # sent once, not again
    w.collect()
    assert (tmp_path / "a.tif").read_bytes() == TIFF  # beside the file
    entry = json.loads((tmp_path / STATE_NAME).read_text())["files"]["a.dng"]
    assert entry["job"] == "j1" and entry["status"] == "done" and entry["saved"] == [str(tmp_path / "a.tif")]
    assert entry["sha256"] == hashlib.sha256(a.read_bytes()).hexdigest() and entry["size"] == a.stat().st_size
    restarted = _watcher(api, tmp_path, clock)
    os.utime(a, (a.stat().st_atime, a.stat().st_mtime + 5))  # touched, same bytes: not a new shot
    _raw(tmp_path / "b.dng", b"II*\x00other")
    assert _settle(restarted, clock) == 1 and len(api.calls("POST", "/v1/jobs")) == 2
    assert restarted.pending() == ["b.dng"]


def test_watch_keeps_both_outputs_of_two_files_with_one_stem(api: FakeApi, tmp_path: Path) -> None:
    """shot.dng and shot.IIQ in one folder both render to a.tif here: the second is saved as a_2.tif, not over the
    first's; a changed file sent again rewrites its own output."""
    _serve_jobs(api, {"j1": "done", "j2": "done", "j3": "done"})
    first = _raw(tmp_path / "a.dng")
    clock = [1000.0]
    w = _watcher(api, tmp_path, clock)
    assert _settle(w, clock) == 1
    w.collect()
    _raw(tmp_path / "a.IIQ", b"II*\x00second")
    assert _settle(w, clock) == 1
    w.collect()
    files = json.loads((tmp_path / STATE_NAME).read_text())["files"]
    assert files["a.dng"]["saved"] == [str(tmp_path / "a.tif")]
    assert files["a.IIQ"]["saved"] == [str(tmp_path / "a_2.tif")]
    first.write_bytes(b"II*\x00changed")
    assert _settle(w, clock) == 1
    w.collect()
    assert json.loads((tmp_path / STATE_NAME).read_text())["files"]["a.dng"]["saved"] == [str(tmp_path / "a.tif")]


def test_watch_resends_a_changed_file_and_skips_partial_copies(api: FakeApi, tmp_path: Path) -> None:
    _serve_jobs(api, {"j1": "done", "j2": "done"})
    a = _raw(tmp_path / "a.dng")
    _raw(tmp_path / "b.dng.part")
    _raw(tmp_path / ".c.dng")
    clock = [1000.0]
    w = _watcher(api, tmp_path, clock)
    assert _settle(w, clock) == 1
    a.write_bytes(b"II*\x00new content")
    assert _settle(_watcher(api, tmp_path, clock), clock) == 1
    assert json.loads((tmp_path / STATE_NAME).read_text())["files"]["a.dng"]["job"] == "j2"
    assert len(api.calls("POST", "/v1/jobs")) == 2


def test_watch_keeps_files_pending_while_the_api_is_down_and_collects_later(api: FakeApi, tmp_path: Path) -> None:
    from cli.client import Unreachable

    _raw(tmp_path / "a.dng")
    clock = [1000.0]
    api.route("POST", "/v1/jobs", (503, {"type": "unavailable", "detail": "restarting"}))
    w = _watcher(api, tmp_path, clock, out=tmp_path / "out")
    w.poll()
    clock[0] += 2.5
    with pytest.raises(Unreachable):
        w.poll()
    assert not (tmp_path / STATE_NAME).exists()  # nothing recorded as sent
    _serve_jobs(api, {"j1": "done"})
    clock[0] += 2.5
    assert w.poll() == 1
    w.collect()
    assert (tmp_path / "out" / "a.tif").read_bytes() == TIFF


def test_watch_records_a_refused_file_and_does_not_retry_it(api: FakeApi, tmp_path: Path) -> None:
    _raw(tmp_path / "a.dng")
    clock = [1000.0]
    api.route("POST", "/v1/jobs", (422, {"type": "not_a_raw_file", "detail": "frame 0 is not RAW"}))
    w = _watcher(api, tmp_path, clock)
    assert _settle(w, clock) == 0
    clock[0] += 5
    w.poll()
    assert len(api.calls("POST", "/v1/jobs")) == 1
    entry = json.loads((tmp_path / STATE_NAME).read_text())["files"]["a.dng"]
    assert entry["status"] == "refused" and "not_a_raw_file" in entry["error"]
    assert w.refused == ["a.dng"]  # `watch --once` exits 1 for it (it exited 0: a cron job never saw the refusal)


def test_watch_once_exits_3_when_the_api_never_answers(tmp_path: Path) -> None:
    _raw(tmp_path / "a.dng")
    url = f"http://127.0.0.1:{_closed_port()}"
    done = runner.invoke(app, ["--retry-for", "1", "watch", str(tmp_path), "--once", "--settle", "0.1",
                               "--api", url, "--token", "t"])
    assert done.exit_code == 3 and "cannot reach the Strata API" in done.output and "retrying" in done.output
    assert not (tmp_path / STATE_NAME).exists()


def test_watch_refuses_a_corrupt_state_file_rather_than_resending_everything(api: FakeApi, tmp_path: Path) -> None:
    (tmp_path / STATE_NAME).write_text("{not json")
    done = runner.invoke(app, ["watch", str(tmp_path), "--once", *_auth(api)])
    assert done.exit_code == 2 and "not a watch state file" in done.output and api.calls("POST", "/v1/jobs") == []


def test_submit_prints_what_was_sent_when_the_service_goes_away_midway(api: FakeApi, tmp_path: Path) -> None:
    _raw(tmp_path / "a.dng")
    _raw(tmp_path / "b.dng")
    answers = iter([(202, job("j1"))])
    api.route("POST", "/v1/jobs", lambda s: next(answers, (503, {"type": "unavailable", "detail": "down"})))
    done = runner.invoke(app, ["--retry-for", "1", "submit", str(tmp_path), "--no-wait", "--json", *_auth(api)])
    assert done.exit_code == 3
    assert [(s["job"], s["status"]) for s in json.loads(done.stdout)] == [("j1", "queued"), (None, "not_sent")]


def test_serve_refuses_a_port_another_program_holds_before_starting_anything(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--data-dir",
                               str(tmp_path / "data")], env={**os.environ, "COLUMNS": "200"}, capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 2
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in done.stdout + done.stderr
    assert not (tmp_path / "data").exists()  # nothing started, nothing written


def test_a_second_serve_on_one_data_dir_is_refused_before_it_starts_anything(tmp_path: Path) -> None:
    """The data dir's lock is held by a running serve (here: a process holding it the same way): a second serve
    exits 2 naming it, before it starts a Redis on the first one's files; the lock goes with its holder."""
    import os
    import subprocess
    import sys

    data = tmp_path / "data"
    data.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242 8000\\n'); f.flush(); print('held', "
                               "flush=True); time.sleep(60)", str(data / "serve.lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--port", str(_closed_port()),
                               "--data-dir", str(data)], env={**os.environ, "COLUMNS": "200"}, capture_output=True,
                              text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert f"another strata serve (pid 4242, API port 8000) is using the data dir {data}" in said
    assert not (data / "redis").exists() and not (data / "logs").exists()  # nothing started


def test_serve_refuses_a_data_dir_it_cannot_write(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys

    (tmp_path / "a-file").write_text("not a folder")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--data-dir",
                           str(tmp_path / "a-file" / "data")], env={**os.environ, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"data dir {tmp_path / 'a-file' / 'data'} cannot be used: Not a directory" in done.stdout + done.stderr


def test_a_database_that_cannot_be_reached_is_one_line_with_its_password_hidden(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "300",
           "STRATA_DATABASE_URL": "postgresql+psycopg://strata:s3cret@127.0.0.1:1/strata"}
    done = subprocess.run([sys.executable, "-m", "cli.main", "db", "upgrade", "--data-dir", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2
    assert "the database postgresql+psycopg://strata:***@127.0.0.1:1/strata cannot be used: connection" in out
    assert "s3cret" not in out and "Traceback" not in out


def _state(root: Path) -> dict[str, Any]:
    return dict(json.loads((root / STATE_NAME).read_text())["files"])


def _serve_outputs(api: FakeApi, bodies: dict[str, bytes]) -> None:
    """POST /v1/jobs answers j1, j2, ... in turn; job ``jN`` is done with one output ``a.tif`` of ``bodies[jN]``."""
    count = iter(range(1, 100))
    api.route("POST", "/v1/jobs", lambda s: (202, job(f"j{next(count)}")))
    for job_id, body in bodies.items():
        out = {"name": "a.tif", "url": f"/v1/jobs/{job_id}/outputs/a.tif", "sha256": hashlib.sha256(body).hexdigest(),
               "bytes": len(body)}
        api.route("GET", f"/v1/jobs/{job_id}", (200, job(job_id, "done", outputs=[out])))
        api.route("GET", f"/v1/jobs/{job_id}/outputs/a.tif", (200, body))


def _delete_on_first_upload(api: FakeApi, victim: Path) -> None:
    """The first upload deletes ``victim`` meanwhile (a photographer deleting a reject); uploads answer j1, j2, ..."""
    count = iter(range(1, 100))

    def post(seen: Seen) -> tuple[int, Any]:
        n = next(count)
        if n == 1:
            victim.unlink()
        return 202, job(f"j{n}")

    api.route("POST", "/v1/jobs", post)


def test_submit_reports_a_file_deleted_midway_as_not_sent_and_saves_the_others(api: FakeApi, tmp_path: Path
                                                                               ) -> None:
    """Found from outside: a file deleted while `strata submit dir/` ran was a FileNotFoundError traceback (exit 1),
    and the shots already sent were never downloaded."""
    for name in ("a", "b", "c"):
        _raw(tmp_path / "in" / f"{name}.dng", f"II*\x00{name}".encode())
    _serve_outputs(api, {"j1": TIFF, "j2": TIFF + b"2"})
    _delete_on_first_upload(api, tmp_path / "in" / "b.dng")
    done = runner.invoke(app, ["submit", str(tmp_path / "in"), "--json", "--out", str(tmp_path / "out"), *_auth(api)])
    assert done.exit_code == 1, done.output
    shots = json.loads(done.stdout)
    assert [(s["job"], s["status"]) for s in shots] == [("j1", "done"), (None, "not_sent"), ("j2", "done")]
    assert "b.dng: gone before it was sent" in shots[1]["error"]
    assert [Path(s["paths"][0]).read_bytes() for s in (shots[0], shots[2])] == [TIFF, TIFF + b"2"]


def test_an_upload_whose_file_is_gone_sends_nothing_and_leaves_no_bar(api: FakeApi, tmp_path: Path) -> None:
    from rich.progress import Progress

    from cli.client import FileGone
    from cli.discovery import Shot
    from cli.station import post_shot

    shot = Shot((_raw(tmp_path / "a.dng"), tmp_path / "b.dng"))  # b.dng deleted after it was found
    with httpx.Client(base_url=api.url) as client, Progress(console=Console(file=io.StringIO())) as progress:
        with pytest.raises(FileGone, match="b.dng: gone before it was sent"):
            post_shot(client, "/v1/jobs", shot, {}, progress)
        assert progress.tasks == []
    assert api.seen == []


def test_watch_says_a_file_deleted_before_it_was_sent_is_gone_and_goes_on(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: a file deleted between the listing and its upload stopped `strata watch` with a
    FileNotFoundError traceback. It is not recorded: if it comes back, it is sent."""
    _raw(tmp_path / "a.dng")
    _raw(tmp_path / "b.dng", b"II*\x00b")
    _delete_on_first_upload(api, tmp_path / "b.dng")
    clock = [1000.0]
    w = _watcher(api, tmp_path, clock)
    assert _settle(w, clock) == 1
    assert "b.dng: gone before it was sent" in w.console.file.getvalue()  # type: ignore[attr-defined]
    assert list(_state(tmp_path)) == ["a.dng"]
    _raw(tmp_path / "b.dng", b"II*\x00b")
    assert _settle(w, clock) == 1 and sorted(_state(tmp_path)) == ["a.dng", "b.dng"]


def test_a_file_name_that_is_not_utf8_is_sent_with_its_bad_bytes_replaced(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: a Latin-1 ``caf\\xe9.dng`` stopped `strata watch` and `strata submit` with a
    UnicodeEncodeError in httpx's multipart before anything was recorded, so every restart crashed on it again. It
    is sent as ``caf\\ufffd.dng``, its output saved beside it; stdout prints its name as its bytes (a UTF-8
    locale's strict stdout crashed on it)."""
    import subprocess
    import sys

    name = os.fsdecode(b"caf\xe9.dng")
    hot = tmp_path / "hot"
    _raw(hot / name)
    _serve_outputs(api, {"j1": TIFF})
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "COLUMNS": "200"}
    for args in (["watch", str(hot), "--once", "--settle", "0.1"], ["submit", str(hot), "--no-wait"]):
        done = subprocess.run([sys.executable, "-m", "cli.main", *args, *_auth(api)], capture_output=True, env=env,
                              timeout=120)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout == b"caf\xe9.dng\tj2\tqueued\t\n"
    posted = [s.body for s in api.calls("POST", "/v1/jobs")]
    assert len(posted) == 2 and all(b'filename="caf\xef\xbf\xbd.dng"' in body for body in posted)
    assert (hot / "a.tif").read_bytes() == TIFF and _state(hot)[name]["status"] == "done"


def _read_only(folder: Path, cmd: list[str]) -> list[str]:
    """``cmd`` run where ``folder`` cannot be written, as on a read-only share: under root (which writes whatever
    the modes say) in a mount namespace of its own where the folder is a read-only bind mount; else by its modes."""
    import shutil
    import subprocess

    if os.geteuid() != 0:
        folder.chmod(0o555)
        return cmd
    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("root without mount namespaces: no way to make a folder read-only")
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(folder), *cmd]


def test_watch_refuses_a_hot_folder_it_cannot_write_before_sending_anything(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: on a read-only share with --out elsewhere, the shot was uploaded, then writing the state
    file failed with a traceback, and every restart uploaded it again."""
    import subprocess
    import sys

    hot = _raw(tmp_path / "hot" / "a.dng").parent
    _serve_outputs(api, {"j1": TIFF})
    cmd = [sys.executable, "-m", "cli.main", "watch", str(hot), "--once", "--settle", "0.1", "--out",
           str(tmp_path / "out"), *_auth(api)]
    try:
        done = subprocess.run(_read_only(hot, cmd), capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "300"})
    finally:
        hot.chmod(0o755)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert f"the hot folder {hot} cannot be written" in said and "keeps its state file .strata-watch.json" in said
    assert api.calls("POST", "/v1/jobs") == [] and "Traceback" not in said


def test_watch_stops_on_a_refusal_of_its_options_and_records_nothing(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: `--recipe tif16` started while the API was down (recipes not checked) recorded every
    file as refused; a restart with the right recipe then sent nothing and exited 0. A refusal of the options
    stops the watcher (exit 2) with nothing recorded; another one not of the file's making exits 1, likewise."""
    _raw(tmp_path / "a.dng")
    watch = ["watch", str(tmp_path), "--once", "--settle", "0.1", *_auth(api)]
    api.route("POST", "/v1/jobs", (422, {"type": "invalid_input", "detail": "unknown recipe 'tif16'"}))
    bad = runner.invoke(app, [*watch, "--recipe", "tif16"])
    said = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "refused the watcher's options: 422 invalid_input: unknown recipe 'tif16'" in said
    api.route("POST", "/v1/jobs", (404, {"type": "not_found", "detail": "no such route"}))  # a proxy's wrong path
    lost = runner.invoke(app, watch)
    assert lost.exit_code == 1 and "nothing was recorded" in " ".join(lost.output.split())
    assert not (tmp_path / STATE_NAME).exists()
    _serve_outputs(api, {"j1": TIFF})
    good = runner.invoke(app, [*watch, "--recipe", "tiff16"])
    assert good.exit_code == 0, good.output
    assert (tmp_path / "a.tif").read_bytes() == TIFF and _state(tmp_path)["a.dng"]["status"] == "done"


def test_watch_sends_again_a_file_recorded_as_refused_for_the_options_by_an_earlier_release(api: FakeApi,
                                                                                          tmp_path: Path) -> None:
    files = {}
    for name, error in (("a.dng", "422 invalid_input: unknown recipe 'tif16'"),
                        ("b.dng", "422 not_a_raw_file: b.dng: not a RAW file")):
        st = _raw(tmp_path / name, name.encode()).stat()
        files[name] = {"size": st.st_size, "mtime": st.st_mtime, "mtime_ns": st.st_mtime_ns, "sha256": "0" * 64,
                       "job": None, "status": "refused", "error": error, "saved": [], "sent_at": "2026-12-01T10:00Z"}
    (tmp_path / STATE_NAME).write_text(json.dumps({"version": 1, "files": files}))
    _serve_outputs(api, {"j1": TIFF})
    done = runner.invoke(app, ["watch", str(tmp_path), "--once", "--settle", "0.1", *_auth(api)])
    assert done.exit_code == 0, done.output
    state = _state(tmp_path)
    assert state["a.dng"]["status"] == "done" and state["b.dng"]["status"] == "refused"
    assert len(api.calls("POST", "/v1/jobs")) == 1


def test_watch_refuses_a_stack_camera_up_front(api: FakeApi, tmp_path: Path) -> None:
    """The watcher sends each file alone; `--camera IQ2_XS` (2-16 frames) had every file refused."""
    _raw(tmp_path / "a.dng")
    done = runner.invoke(app, ["watch", str(tmp_path), "--once", "--camera", "IQ2_XS", *_auth(api)])
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and "--camera IQ2_XS takes stacks of 2-16 frames" in said and api.seen == []


def test_watch_ends_an_entry_whose_outputs_are_gone(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: after `strata jobs remove-files`, the watcher tried the download again twice a second
    (410 gone) forever, and `--once --timeout 15` ended with "1 job(s) still running"."""
    _raw(tmp_path / "a.dng")
    _serve_outputs(api, {"j1": TIFF})
    api.route("GET", "/v1/jobs/j1/outputs/a.tif", (410, {"type": "gone", "detail": "the files of job j1 were removed"}))
    start = time.monotonic()
    done = runner.invoke(app, ["watch", str(tmp_path), "--once", "--settle", "0.1", "--timeout", "15", *_auth(api)])
    said = " ".join(done.output.split())
    assert done.exit_code == 1 and time.monotonic() - start < 10, said
    assert "a.dng: the outputs of job j1 are gone from the service" in said and "still running" not in said
    assert _state(tmp_path)["a.dng"]["status"] == "gone" and "410 gone" in _state(tmp_path)["a.dng"]["error"]
    again = runner.invoke(app, ["watch", str(tmp_path), "--once", "--settle", "0.1", *_auth(api)])
    assert again.exit_code == 0 and len(api.calls("GET", "/v1/jobs/j1/outputs/a.tif")) == 1


def test_submit_never_overwrites_an_earlier_runs_output(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: `strata submit A.dng --out o1` then `strata submit other/A.dng --out o1` replaced the
    first shot's render with the second's. The second takes the next free name."""
    _raw(tmp_path / "A.dng")
    _raw(tmp_path / "other" / "A.dng", b"II*\x00other")
    _serve_outputs(api, {"j1": TIFF, "j2": TIFF + b"2"})
    first = runner.invoke(app, ["submit", str(tmp_path / "A.dng"), "--out", str(tmp_path / "o1"), *_auth(api)])
    second = runner.invoke(app, ["submit", str(tmp_path / "other" / "A.dng"), "--out", str(tmp_path / "o1"),
                                 *_auth(api)])
    assert first.exit_code == second.exit_code == 0, second.output
    assert second.stdout.strip() == str(tmp_path / "o1" / "a_2.tif")
    assert (tmp_path / "o1" / "a.tif").read_bytes() == TIFF and (tmp_path / "o1" / "a_2.tif").read_bytes() == \
        TIFF + b"2"


def test_watch_never_overwrites_a_file_it_did_not_save_for_that_file(api: FakeApi, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: the watcher replaced a photographer's own look.tif beside look.dng; and one restarted
    with DIR spelled another way (relative, then absolute) saved shot.IIQ's output over shot.dng's shot.tif."""
    hot = tmp_path / "hot"
    _raw(hot / "a.dng")
    (hot / "a.tif").write_bytes(b"the photographer's own")
    _serve_jobs(api, {"j1": "done", "j2": "done"})
    clock = [1000.0]
    monkeypatch.chdir(tmp_path)
    w = _watcher(api, Path("hot"), clock)
    assert _settle(w, clock) == 1
    w.collect()
    assert (hot / "a.tif").read_bytes() == b"the photographer's own" and (hot / "a_2.tif").read_bytes() == TIFF
    _raw(hot / "a.IIQ", b"II*\x00second")  # its output has the same name (and here the same bytes)
    restarted = _watcher(api, hot, clock)
    assert _settle(restarted, clock) == 1
    restarted.collect()
    assert _state(hot)["a.IIQ"]["saved"] == [str(hot / "a_3.tif")]


@pytest.mark.parametrize("body", ['{"version": 1, "files": {"c.dng": {}}}', '{"version": 1, "files": {"c.dng": "x"}}',
                                  '{"version": 1, "files": {"c.dng": {"size": 7, "mtime_ns": "1"}}}', "[]"])
def test_watch_refuses_a_state_file_with_a_broken_entry(api: FakeApi, tmp_path: Path, body: str) -> None:
    """Found from outside: an entry without "size" was a KeyError traceback (exit 1), a string entry a TypeError."""
    _raw(tmp_path / "c.dng")
    (tmp_path / STATE_NAME).write_text(body)
    done = runner.invoke(app, ["watch", str(tmp_path), "--once", "--settle", "0.1", *_auth(api)])
    assert done.exit_code == 2 and "is not a watch state file" in " ".join(done.output.split()), done.output
    assert api.calls("POST", "/v1/jobs") == []


def test_watch_refuses_a_state_file_of_a_newer_release_and_leaves_it_as_it_is(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: version 99 was read as if it were 1, and rewritten as version 1."""
    _raw(tmp_path / "c.dng")
    body = '{"version": 99, "files": {}, "what_99_adds": true}'
    (tmp_path / STATE_NAME).write_text(body)
    done = runner.invoke(app, ["watch", str(tmp_path), "--once", "--settle", "0.1", *_auth(api)])
    assert done.exit_code == 2 and "written by a newer strata (state version 99" in " ".join(done.output.split())
    assert (tmp_path / STATE_NAME).read_text() == body and api.seen == []


def test_a_stack_of_one_file_is_bad_usage(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: `strata submit x.dng --stack` went out as a single shot, exit 0."""
    done = runner.invoke(app, ["submit", str(_raw(tmp_path / "x.dng")), "--stack", *_auth(api)])
    assert done.exit_code == 2 and "a stack has 2-16 frames, not 1" in done.output and api.seen == []


def test_jobs_list_refuses_an_unknown_status_as_bad_usage(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs", (200, {"jobs": [], "next_cursor": None}))
    bad = runner.invoke(app, ["jobs", "list", "--status", "bogus", *_auth(api)])
    assert bad.exit_code == 2 and "unknown status bogus" in bad.output and api.seen == []
    several = runner.invoke(app, ["jobs", "list", "--status", "done,failed", "--json", *_auth(api)])
    assert several.exit_code == 0 and api.calls("GET", "/v1/jobs")[0].query == "limit=20&status=done%2Cfailed"


def test_comma_separated_recipes_are_several_recipes(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: `--recipe tiff16,jpeg-proof` was refused as one unknown recipe (the API splits it)."""
    api.route("GET", "/v1/recipes", (200, {"recipes": [{"name": "tiff16"}, {"name": "jpeg-proof"}]}))
    _serve_jobs(api, {})
    done = runner.invoke(app, ["submit", str(_raw(tmp_path / "a.dng")), "--recipe", "tiff16,jpeg-proof", "--no-wait",
                               *_auth(api)])
    assert done.exit_code == 0, done.output
    body = api.calls("POST", "/v1/jobs")[0].body
    assert b'name="recipe"\r\n\r\ntiff16\r\n' in body and b'name="recipe"\r\n\r\njpeg-proof\r\n' in body


def test_a_recipe_in_another_case_passes_the_check_where_it_names_one_recipe(api: FakeApi, tmp_path: Path) -> None:
    """Found from outside: `--recipe TIFF16` was refused (exit 2) though the API takes any case (RECIPES.md)."""
    api.route("GET", "/v1/recipes", (200, {"recipes": [{"name": "tiff16"}, {"name": "web"}, {"name": "WEB"}]}))
    _serve_jobs(api, {})
    done = runner.invoke(app, ["submit", str(_raw(tmp_path / "a.dng")), "--recipe", "TIFF16", "--no-wait",
                               *_auth(api)])
    assert done.exit_code == 0, done.output
    assert b'name="recipe"\r\n\r\nTIFF16\r\n' in api.calls("POST", "/v1/jobs")[0].body  # the API resolves it
    ambiguous = runner.invoke(app, ["submit", str(_raw(tmp_path / "b.dng")), "--recipe", "Web", "--no-wait",
                                    *_auth(api)])  # web or WEB: names no one recipe
    assert ambiguous.exit_code == 2 and "unknown recipe Web" in ambiguous.output


def test_a_cancelled_job_is_said_to_be_cancelled_without_a_none(api: FakeApi, tmp_path: Path) -> None:
    api.route("GET", "/v1/jobs/j1", (200, job("j1", "cancelled")))
    done = runner.invoke(app, ["jobs", "download", "j1", "--out", str(tmp_path), *_auth(api)])
    assert done.exit_code == 1 and "error: job j1 cancelled" in done.output and "None" not in done.output
