"""`strata submit` / `strata jobs` client: waiting survives an API that stops answering for a while; a download
that does not match its checksum leaves no file behind. (The happy paths run against the real service in e2e.)"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from cli.client import SubmitError, download_outputs, wait_for_job

JOB: dict[str, Any] = {"id": "j1", "status": "running", "stage": "render", "progress": 0.5, "outputs": [],
                       "error": None}


def _client(handler: httpx.MockTransport) -> httpx.Client:
    return httpx.Client(base_url="http://api", transport=handler)


def test_wait_rides_out_an_api_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cli.client.time.sleep", lambda s: None)
    answers = iter(["down", "503", "running", "done"])

    def handler(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if answer == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if answer == "503":
            return httpx.Response(503, json={"type": "unavailable", "detail": "restarting"})
        return httpx.Response(200, json={**JOB, "status": answer, "progress": 1.0 if answer == "done" else 0.7})

    done = wait_for_job(_client(httpx.MockTransport(handler)), JOB, 60, Console(file=io.StringIO()))
    assert done["status"] == "done"


def test_wait_reports_a_failed_job_and_a_client_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cli.client.time.sleep", lambda s: None)
    failed = httpx.MockTransport(lambda r: httpx.Response(200, json={**JOB, "status": "failed", "error": "boom"}))
    with pytest.raises(SubmitError, match="failed: boom"):
        wait_for_job(_client(failed), JOB, 60, Console(file=io.StringIO()))
    gone = httpx.MockTransport(lambda r: httpx.Response(404, json={"type": "not_found", "detail": "no job j1"}))
    with pytest.raises(SubmitError, match="404 not_found"):
        wait_for_job(_client(gone), JOB, 60, Console(file=io.StringIO()))


def test_a_corrupt_download_leaves_nothing(tmp_path: Path) -> None:
    body = b"II*\x00" + b"x" * 5000
    output: dict[str, Any] = {"name": "a.tif", "url": "/v1/jobs/j1/outputs/a.tif",
                              "sha256": hashlib.sha256(b"other").hexdigest(), "bytes": len(body)}
    job = {**JOB, "status": "done", "outputs": [output]}
    client = _client(httpx.MockTransport(lambda r: httpx.Response(200, content=body)))
    with pytest.raises(SubmitError, match="sha256"):
        download_outputs(client, job, tmp_path, Console(file=io.StringIO()))
    assert list(tmp_path.iterdir()) == []
    output["sha256"] = hashlib.sha256(body).hexdigest()
    assert download_outputs(client, job, tmp_path, Console(file=io.StringIO())) == [tmp_path / "a.tif"]
    assert (tmp_path / "a.tif").read_bytes() == body and not (tmp_path / "a.tif.part").exists()


def test_a_refused_shot_keeps_its_sent_bytes_on_the_overall_bar(tmp_path: Path) -> None:
    """The overall upload bar counts a refused shot's bytes as sent (it went back to 0 before, showing a negative
    speed); a try that will be retried (no answer) takes its bytes back off, so the retry does not count twice."""
    from rich.progress import Progress

    from cli.client import Unreachable
    from cli.discovery import Shot
    from cli.station import post_shot

    shot = Shot((tmp_path / "a.dng",))
    shot.files[0].write_bytes(b"x" * 1000)

    def upload(answer: httpx.Response | None) -> float:
        def handler(request: httpx.Request) -> httpx.Response:
            request.read()
            if answer is None:
                raise httpx.ConnectError("connection refused", request=request)
            return answer

        with Progress(console=Console(file=io.StringIO())) as progress:
            overall = progress.add_task("upload", total=1000)
            with pytest.raises(SubmitError) as info:
                post_shot(_client(httpx.MockTransport(handler)), "/v1/jobs", shot, {}, progress, overall)
            assert isinstance(info.value, Unreachable) == (answer is None)
            return progress.tasks[0].completed

    assert upload(httpx.Response(422, json={"type": "not_a_raw_file", "detail": "a.dng: not a RAW file"})) == 1000
    assert upload(None) == 0


@pytest.mark.parametrize(("header", "expected"), [
    ("attachment; filename=\"frame_00.tif\"; filename*=UTF-8''%E5%86%99%E7%9C%9F.tif", "写真.tif"),
    ('attachment; filename="frame_00.tif"', "frame_00.tif"),  # plain ASCII names send no filename*
    (None, "frame_00.tif"),
    ("attachment; filename*=UTF-8''..%2Fevil.tif", "frame_00.tif"),  # a separator: never a path
    ("attachment; filename*=UTF-8''.hidden.tif", "frame_00.tif"),
    ("attachment; filename*=UTF-8''%E5%86%99.jpg", "frame_00.tif"),  # not the output's extension
    ("attachment; filename*=UTF-8''" + "%E5%86%99" * 80 + ".tif", "frame_00.tif"),  # 244 bytes: too long a name
])
def test_the_local_name_is_the_services_spelling_when_it_is_a_plain_file_name(header: str | None,
                                                                              expected: str) -> None:
    from cli.client import local_name

    assert local_name(header, "frame_00.tif") == expected


def test_shots_whose_outputs_share_a_name_both_keep_theirs(tmp_path: Path) -> None:
    """Two shots with names that fold to the same output (写真.dng and 日本語.dng both became frame_00.tif; shot.dng
    and shot.iiq both shot.tif) are saved side by side in one run, the later with _2, not one over the other."""
    bodies = {"j1": b"II*\x00first", "j2": b"II*\x00second"}

    def job(job_id: str) -> dict[str, Any]:
        body = bodies[job_id]
        return {**JOB, "id": job_id, "status": "done", "outputs": [
            {"name": "shot.tif", "url": f"/v1/jobs/{job_id}/outputs/shot.tif", "bytes": len(body),
             "sha256": hashlib.sha256(body).hexdigest()}]}

    client = _client(httpx.MockTransport(lambda r: httpx.Response(200, content=bodies[r.url.path.split("/")[3]])))
    taken: set[str] = set()
    first = download_outputs(client, job("j1"), tmp_path, Console(file=io.StringIO()), taken)
    second = download_outputs(client, job("j2"), tmp_path, Console(file=io.StringIO()), taken)
    assert [p.name for p in first + second] == ["shot.tif", "shot_2.tif"]
    assert first[0].read_bytes() == bodies["j1"] and second[0].read_bytes() == bodies["j2"]
    again = download_outputs(client, job("j1"), tmp_path, Console(file=io.StringIO()))  # a new run: same path
    assert again == first


def test_an_output_that_cannot_be_saved_is_a_submit_error_not_a_traceback(tmp_path: Path) -> None:
    body = b"II*\x00tiff"
    job = {**JOB, "status": "done", "outputs": [{"name": "a.tif", "url": "/v1/jobs/j1/outputs/a.tif",
                                                 "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}]}
    client = _client(httpx.MockTransport(lambda r: httpx.Response(200, content=body)))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(SubmitError, match="cannot save outputs in"):
        download_outputs(client, job, tmp_path / "file" / "out", Console(file=io.StringIO()))
