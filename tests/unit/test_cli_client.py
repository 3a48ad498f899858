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
