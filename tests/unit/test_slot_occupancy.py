"""scripts/gpu/slot_occupancy.py reads the strip lines the GPU worker writes (services/pipeline/shards.py)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from services.pipeline import shards

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "slot_occupancy.py"


def _script():
    spec = importlib.util.spec_from_file_location("slot_occupancy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slot_holds_are_read_from_the_workers_own_strip_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    made = shards._Made(seconds=0.35)
    with caplog.at_level(logging.INFO, logger=shards.log.name):
        shards._log_strip("jobs/j1/p0/strip_000.npy", 1, made, 0.80, 0.25, 0.30)  # holds 0.55 s, then stores 0.30
        shards._log_strip("jobs/j2/p0/strip_000.npy", 1, made, 0.55, 0.00, 0.30)
    stamps = ["2026-12-06 22:20:14,800", "2026-12-06 22:20:15,100"]  # as a Celery worker's log prefixes them
    log = tmp_path / "gpu0.log"
    log.write_text("".join(f"[{t}: INFO/MainProcess] {r.getMessage()}\n" for t, r in zip(stamps, caplog.records,
                                                                                        strict=True)))
    holds = _script().holds(str(log))
    assert len(holds) == 2 and not holds[0]["interactive"] and holds[0]["tiles"] == 0.35
    assert abs((holds[0]["end"] - holds[0]["start"]) - 0.55) < 1e-6
    assert abs(holds[1]["end"] - (holds[0]["end"] + 0.3)) < 1e-6  # 14.80 - 0.30 and 15.10 - 0.30


def test_occupancy_counts_the_slots_held_at_each_moment() -> None:
    strips = [{"start": 0.0, "end": 2.0}, {"start": 1.0, "end": 3.0}, {"start": 1.5, "end": 1.75}]
    shares = _script().occupancy(strips, 0.0, 4.0)
    assert shares == {0: 0.25, 1: 0.5, 2: 0.1875, 3: 0.0625}
