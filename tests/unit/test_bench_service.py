"""The service benchmark's timeline: where a job's processing time went, from the API's stamps."""

import datetime as dt
import subprocess
import sys
import time

from lab.bench.sampler import ResourceSampler, Sample
from lab.bench.service import finalize_split, sustained_rate, sustained_window, timeline


def _shard(phase: int, kind: str, start: str, end: str) -> dict:
    return {"phase": phase, "kind": kind, "started_at": f"2026-11-30T10:00:{start}Z",
            "finished_at": f"2026-11-30T10:00:{end}Z"}


def test_timeline_splits_processing_into_ingest_phases_hops_and_finalize() -> None:
    job = {"started_at": "2026-11-30T10:00:00.000000Z", "finished_at": "2026-11-30T10:00:03.000000Z",
           "shards": [_shard(0, "frame_group", "00.500000", "01.900000"), _shard(0, "frame_group", "00.520000",
                                                                                  "02.000000"),
                      _shard(1, "strip", "02.050000", "02.200000"), _shard(1, "strip", "02.060000", "02.300000")]}
    t = timeline(job)
    assert list(t) == ["ingest", "phase 0 frame_group", "hop 1", "phase 1 strip", "finalize"]
    assert abs(t["ingest"] - 0.5) < 1e-9 and abs(t["phase 0 frame_group"] - 1.5) < 1e-9
    assert abs(t["hop 1"] - 0.05) < 1e-9 and abs(t["phase 1 strip"] - 0.25) < 1e-9
    assert abs(t["finalize"] - 0.7) < 1e-9
    assert abs(sum(t.values()) - 3.0) < 1e-9  # the parts cover the whole processing time


def test_the_wait_for_a_gpu_slot_is_told_apart_from_the_ingest() -> None:
    job = {"started_at": "2026-11-30T10:00:00.000000Z", "finished_at": "2026-11-30T10:00:02.000000Z",
           "timings": {"decode_s": 0.1, "prepare_s": 0.2}, "shards": [_shard(0, "strip", "00.900000", "01.500000")]}
    t = timeline(job)
    assert list(t) == ["ingest", "queue", "phase 0 strip", "finalize"]
    assert abs(t["ingest"] - 0.2) < 1e-9 and abs(t["queue"] - 0.7) < 1e-9
    assert abs(sum(t.values()) - 2.0) < 1e-9


def test_the_finalize_is_split_from_the_jobs_own_timings() -> None:
    job = {"timings": {"prepare_s": 0.2, "finalize_wait_s": 0.05, "finalize_read_s": 0.02, "encode_s": 0.3}}
    split = finalize_split(job, 0.4)
    assert list(split) == ["wait", "read", "encode", "rest"]
    assert abs(split["rest"] - 0.03) < 1e-9  # the parts cover the finalize
    assert finalize_split({"timings": {"encode_s": 0.3}}, 0.4) == {}  # a job finalized before the split existed


def test_the_sustained_rate_leaves_out_the_pipeline_fill() -> None:
    t0 = dt.datetime(2026, 12, 4, 12, 0, 0)
    # the first job finishes 2 s after the batch starts, then one every 0.25 s: 4 frames/s once filled
    ends = [t0 + dt.timedelta(seconds=2.0 + 0.25 * k) for k in range(9)]
    rate = sustained_rate(list(reversed(ends)))
    assert rate["finish_span_s"] == 2.0 and rate["sustained_frames_per_s"] == 4.0
    assert sustained_rate(ends[:1]) == {"sustained_frames_per_s": None, "finish_span_s": None}


def test_the_sustained_window_leaves_out_the_fill_and_the_tail() -> None:
    """The resources over the sustained rate's window: the jobs' wall-clock stamps (aware or naive UTC) put on the
    sampler's monotonic clock; the idle fill before the first finish and the tail after the last are left out."""
    sampler = ResourceSampler()
    now_wall, now_mono = dt.datetime.now(dt.UTC), time.monotonic()
    for k in range(40):  # one sample every 0.25 s over the last 10 s: busy only between 6 and 2 s ago
        t = now_mono - 10 + 0.25 * k
        busy = 0.9 if now_mono - 6 <= t <= now_mono - 2 else 0.1
        sampler.samples.append(Sample(t, busy, 1 << 30, [busy]))
    first, last = now_wall - dt.timedelta(seconds=5.9), (now_wall - dt.timedelta(seconds=2.1)).replace(tzinfo=None)
    window = sustained_window(sampler, [last, None, first])
    assert abs(window["gpu_busy_mean"][0] - 0.9) < 1e-9 and abs(window["cpu_busy_mean"] - 0.9) < 1e-9
    assert 14 <= window["samples"] <= 16
    assert sampler.window(now_mono - 10, now_mono)["gpu_busy_mean"][0] < 0.6  # the whole span's mean is diluted
    assert sustained_window(sampler, [first]) == {}


def test_timeline_is_empty_without_stamps() -> None:
    assert timeline({"started_at": None, "finished_at": None, "shards": []}) == {}


def test_strata_bench_help_lists_the_kinds_and_each_kind_has_its_own_help() -> None:
    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "bench", *args], capture_output=True, text=True)

    done = bench("--help")
    assert done.returncode == 0, done.stderr
    assert all(kind in done.stdout for kind in ("pipeline", "enhance", "stack", "service"))
    done = bench("service", "--help")
    assert done.returncode == 0 and "usage: strata bench service" in done.stdout
    done = bench()
    assert done.returncode == 2 and "[options]" in done.stderr


def test_the_cpu_breakdown_names_each_process_by_its_role() -> None:
    from lab.bench.sampler import role

    celery = ["/usr/bin/python3", "-m", "celery", "-A", "workers.app:celery_app", "worker", "-n", "gpu0-2@host-a"]
    assert role(celery) == "gpu0-2"
    assert role(["/x/.venv/bin/python", "-m", "cli.main", "serve", "--port", "8765"]) == "serve"
    assert role(["/usr/bin/redis-server", "127.0.0.1:6379"]) == "redis"
    assert role(["bash", "-c", "sleep 1"]) == "other" and role([]) == "kernel"


def test_the_disk_columns_say_how_busy_each_disk_was_and_how_fast_it_wrote() -> None:
    """Per disk that moved data in the window: the kernel's busy time over the span, MB/s read and written; the
    table names the busiest (a batch that writes faster than the disk syncs waits there)."""
    from lab.bench.sampler import Sample, _disk_window, busy_summary

    first = Sample(10.0, 0.5, 1 << 30, disks={"vda": (0, 1_000_000_000, 5_000), "vdb": (7, 7, 0)})
    last = Sample(12.0, 0.5, 1 << 30, disks={"vda": (2_000_000, 2_600_000_000, 6_000), "vdb": (7, 7, 0)})
    disks = _disk_window([first, last])
    assert list(disks) == ["vda"]  # vdb moved nothing
    assert disks["vda"] == {"busy": 0.5, "read_mb_s": 1.0, "write_mb_s": 800.0}
    line = busy_summary({"cpu_busy_mean": 0.5, "host_used_peak_bytes": 1 << 30, "disks": disks})
    assert "disk vda busy 50% (write 800 MB/s)" in line
