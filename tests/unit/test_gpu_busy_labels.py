"""Per-GPU busy time is told apart by worker, not by GPU id alone (found from outside: three CPU workers made one
``gpu="cpu"`` series and every compose GPU container one ``gpu="0"``, so Grafana's "GPU busy" added GPUs together;
the dashboard's GPU(s) column likewise showed "cpu" / "0" where it now names the workers)."""

from __future__ import annotations

import json
from pathlib import Path

from services.metrics import GPU_BUSY_SECONDS

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_busy_is_labelled_by_worker_and_gpu() -> None:
    assert GPU_BUSY_SECONDS._labelnames == ("worker", "gpu")
    before = GPU_BUSY_SECONDS.labels(worker="cpu1@test-host", gpu="cpu")._value.get()
    GPU_BUSY_SECONDS.labels(worker="cpu1@test-host", gpu="cpu").inc(2.0)
    GPU_BUSY_SECONDS.labels(worker="cpu2@test-host", gpu="cpu").inc(1.0)  # a second worker, its own series
    assert GPU_BUSY_SECONDS.labels(worker="cpu1@test-host", gpu="cpu")._value.get() == before + 2.0


def test_grafana_gpu_busy_panel_draws_one_line_per_worker() -> None:
    board = json.loads((ROOT / "docs/grafana/strata.json").read_text())
    targets = [t for p in board["panels"] for t in p.get("targets", []) if "strata_gpu_busy" in t.get("expr", "")]
    assert len(targets) == 1
    assert "by (worker" in targets[0]["expr"] and "{{worker}}" in targets[0]["legendFormat"]


def test_dashboard_gpus_column_names_the_workers() -> None:
    js = (ROOT / "api/static/dashboard.js").read_text()
    assert "s.worker || s.gpu" in js  # a shard's worker name first; its bare GPU id only when none was recorded
