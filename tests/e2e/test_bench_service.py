"""The service benchmark's CI smoke run: every scenario at a tiny scale through the real service."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack  # the real service's fixture `stack`: tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


def test_bench_service_runs_every_scenario_and_writes_json(stack: Stack, tmp_path: Path) -> None:
    from lab.bench.service import main

    out = tmp_path / "bench.json"
    token = stack.headers["Authorization"].split()[1]
    assert main(["--api", stack.url, "--token", token, "--scale", "0.02", "--repeats", "1", "--batch-size", "2",
                 "--scenarios", "single,stack4,batch", "--interactive-during-batch", "--interactive-shots", "3",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    by_name = {r["scenario"]: r for r in report["scenarios"]}
    assert set(by_name) == {"single", "stack4", "batch"}
    assert by_name["stack4"]["frames"] == 4 and by_name["single"]["processing_median_s"] > 0
    batch = by_name["batch"]
    assert batch["shots"] == 2 and batch["frames_per_s"] > 0 and sum(batch["shards_by_gpu"].values()) >= 2
    inter = batch["interactive_during_batch"]
    runs = inter["queued_to_done_runs_s"]  # the first shot always; more only while the batch still ran
    assert 1 <= len(runs) <= 3 and inter["queued_to_done_s"] == statistics.median(runs)
    assert inter["queued_to_done_s"] > 0 and inter["ratio_to_idle"] > 0
    assert 0 <= batch["resources"]["cpu_busy_mean"] <= 1 and batch["resources"]["host_used_peak_bytes"] > 0
    roles = batch["resources"]["cpu_seconds_by_role"]  # core-seconds by process role: the workers are named
    assert any(name.startswith("coordinator") for name in roles) and any(name.startswith("cpu") for name in roles)


def test_bench_service_batch_uploaded_ahead_renders_after_its_window_opens(stack: Stack,
                                                                          tmp_path: Path) -> None:
    """--upload-ahead: the shots go into a batch whose window opens after the uploads (a studio's night); no job
    starts before every shot is in, and the sustained rate is reported; --remove-files removes each job's files."""
    import datetime as dt

    import httpx

    from lab.bench.service import main

    out = tmp_path / "ahead.json"
    token = stack.headers["Authorization"].split()[1]
    assert main(["--api", stack.url, "--token", token, "--scale", "0.02", "--batch-size", "3", "--upload-ahead",
                 "--remove-files", "--scenarios", "batch", "--json", str(out)]) == 0
    batch = json.loads(out.read_text())["scenarios"][0]
    assert batch["uploaded_ahead"] and batch["shots"] == 3 and batch["sustained_frames_per_s"] > 0
    assert "resources_sustained" in batch  # the busy fractions over the sustained rate's window
    jobs = httpx.get(f"{stack.url}/v1/jobs", headers=stack.headers, params={"limit": 3}).json()["jobs"]
    created = [dt.datetime.fromisoformat(j["created_at"]) for j in jobs]
    started = [dt.datetime.fromisoformat(j["started_at"]) for j in jobs]
    assert min(started) > max(created)  # every shot was in before the first one started
    assert all(j["files_removed_at"] for j in jobs)  # --remove-files: each job's files went once it was done
    gone = httpx.get(f"{stack.url}{jobs[0]['outputs'][0]['url']}", headers=stack.headers)
    assert gone.status_code == 410
