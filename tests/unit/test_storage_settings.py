"""get_storage's choice from STRATA_STORAGE_URL, and the S3 URL's parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config import Settings
from services.storage import LocalStorage, storage_from_settings
from services.storage.s3 import parse_s3_url


def test_unset_or_file_url_is_local(tmp_path: Path) -> None:
    default = storage_from_settings(Settings(data_dir=tmp_path))
    assert isinstance(default, LocalStorage) and default.root == (tmp_path / "storage").resolve()
    chosen = storage_from_settings(Settings(data_dir=tmp_path, storage_url=f"file://{tmp_path / 'elsewhere'}"))
    assert isinstance(chosen, LocalStorage) and chosen.root == (tmp_path / "elsewhere").resolve()
    for bad in ("ftp://x", "s3://", "s3:/bucket", "minio://bucket/x", "file://relative/path", "s3://a"):
        with pytest.raises(ValueError, match="s3://bucket|file://"):
            Settings(data_dir=tmp_path, storage_url=bad)  # refused at start (exit 2), not at the first upload


def test_s3_urls() -> None:
    assert parse_s3_url("s3://strata/studio/a/") == ("strata", "studio/a")
    assert parse_s3_url("s3://strata") == ("strata", "")
    with pytest.raises(ValueError):
        parse_s3_url("s3:///x")


def test_node_name_names_this_host(tmp_path: Path) -> None:
    from workers.launcher import worker_specs

    specs = worker_specs(Settings(data_dir=tmp_path, node_name="hostb", cpu_workers=2), gpus=[])
    assert [s.name for s in specs] == ["coordinator@hostb", "coordinator2@hostb", "coordinator-express@hostb",
                                       "cpu0@hostb", "cpu1@hostb"]
    one = worker_specs(Settings(data_dir=tmp_path, node_name="hostb", coordinators=1, express_coordinators=0),
                       gpus=[], gpu_workers=False)
    assert [s.name for s in one] == ["coordinator@hostb"]


def test_interactive_steps_have_an_express_coordinator_batch_steps_do_not(tmp_path: Path) -> None:
    from workers.launcher import worker_specs
    from workers.queues import COORDINATOR_QUEUE, INTERACTIVE_COORDINATOR_QUEUE, coordinator_queue

    assert coordinator_queue("interactive") == INTERACTIVE_COORDINATOR_QUEUE
    assert coordinator_queue("batch") == COORDINATOR_QUEUE
    specs = {s.name: s for s in worker_specs(Settings(data_dir=tmp_path, node_name="h"), gpus=[], gpu_workers=False)}
    queues = {name: s.argv[s.argv.index("-Q") + 1].split(",") for name, s in specs.items()}
    assert queues == {"coordinator@h": [INTERACTIVE_COORDINATOR_QUEUE, COORDINATOR_QUEUE],
                      "coordinator2@h": [INTERACTIVE_COORDINATOR_QUEUE, COORDINATOR_QUEUE],
                      "coordinator-express@h": [INTERACTIVE_COORDINATOR_QUEUE]}
    assert specs["coordinator-express@h"].env["STRATA_COORDINATOR_LANE"] == "interactive"


def test_workers_per_gpu_start_that_many_pinned_workers(tmp_path: Path) -> None:
    from workers.launcher import worker_specs

    specs = worker_specs(Settings(data_dir=tmp_path, node_name="h", coordinators=1, workers_per_gpu=2),
                         gpus=["0", "1"])
    gpu = [s for s in specs if s.env.get("STRATA_WORKER_KIND") == "gpu"]
    assert [s.name for s in gpu] == ["gpu0@h", "gpu0-2@h", "gpu1@h", "gpu1-2@h"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in gpu] == ["0", "0", "1", "1"]
    assert len({s.argv[s.argv.index("-Q") + 1] for s in gpu}) == 4  # each its own queue beside the shared one
    cpu = worker_specs(Settings(data_dir=tmp_path, node_name="h", cpu_workers=1, workers_per_gpu=2), gpus=[],
                       coordinator=False)
    assert [s.name for s in cpu] == ["cpu0@h"]  # no GPU: STRATA_CPU_WORKERS decides


def test_gpu_workers_compute_gpu_worker_threads_shards_at_once_cpu_workers_one(tmp_path: Path) -> None:
    from workers.launcher import worker_specs

    def pool(spec: object) -> tuple[str, str]:
        argv = spec.argv  # type: ignore[attr-defined]
        return argv[argv.index("--pool") + 1], argv[argv.index("--concurrency") + 1]

    gpu = worker_specs(Settings(data_dir=tmp_path, node_name="h", coordinators=1), gpus=["0"], coordinator=False)
    # The default: two device slots (two shards on the device at once, one model copy), two more threads that
    # store their strips' results meanwhile; interactive shards have the express lane's thread besides
    # (workers/express.py), or one more pool thread without it (services/pipeline/gate.py).
    assert [pool(s) for s in gpu] == [("threads", "4")]
    one = worker_specs(Settings(data_dir=tmp_path, node_name="h", gpu_worker_threads=1, gpu_express_lane=False),
                       gpus=["0"], coordinator=False)
    assert [pool(s) for s in one] == [("threads", "4")]
    alone = worker_specs(Settings(data_dir=tmp_path, node_name="h", gpu_worker_threads=1, gpu_overlap_threads=0,
                                  gpu_urgent_slots=0), gpus=["0"], coordinator=False)
    assert [pool(s) for s in alone] == [("solo", "1")]
    # Several GPU workers on a host: no overlap threads unless asked (they would take shards another GPU could run).
    two = worker_specs(Settings(data_dir=tmp_path, node_name="h", coordinators=1), gpus=["0", "1"], coordinator=False)
    assert [pool(s) for s in two] == [("threads", "2"), ("threads", "2")]
    asked = worker_specs(Settings(data_dir=tmp_path, node_name="h", coordinators=1, gpu_overlap_threads=1),
                         gpus=["0", "1"], coordinator=False)
    assert [pool(s) for s in asked] == [("threads", "3"), ("threads", "3")]
    cpu = worker_specs(Settings(data_dir=tmp_path, node_name="h", gpu_worker_threads=3), gpus=[], coordinator=False)
    assert [pool(s) for s in cpu] == [("solo", "1")]


def test_coordinators_share_the_cores_for_torch_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import launcher

    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 16)
    specs = launcher.worker_specs(Settings(data_dir=tmp_path, node_name="h"), gpus=["0"])
    threads = {s.name: s.env.get("STRATA_TORCH_THREADS") for s in specs}
    # three coordinator processes (two + the express one) of three slots each share 16 cores: one thread each
    assert threads == {"coordinator@h": "1", "coordinator2@h": "1", "coordinator-express@h": "1", "gpu0@h": None}
    two = launcher.worker_specs(Settings(data_dir=tmp_path, node_name="h", coordinator_concurrency=2), gpus=["0"])
    assert {s.env.get("STRATA_TORCH_THREADS") for s in two if s.name.startswith("coordinator")} == {"2"}
    pinned = launcher.worker_specs(Settings(data_dir=tmp_path, node_name="h", torch_threads=3), gpus=[],
                                   gpu_workers=False)
    assert {s.env["OMP_NUM_THREADS"] for s in pinned} == {"3"}


def test_early_syncs_of_durable_writes_follow_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STRATA_EARLY_SYNC_S: a durable write hands its data to the disk every so often while it writes (0: only its
    closing fsync); intermediates (not durable) never sync."""
    import time

    from services.storage import local, storage_from_settings

    calls: list[float] = []
    real = local._sync_while

    def counting(fd: int, stop: object, interval: float) -> None:
        calls.append(interval)
        real(fd, stop, interval)  # type: ignore[arg-type]

    monkeypatch.setattr(local, "_sync_while", counting)
    for early, expected in ((0.05, [0.05]), (0.0, [])):
        calls.clear()
        storage = storage_from_settings(Settings(data_dir=tmp_path, early_sync_s=early))
        with storage.writer("jobs/j/out/a.tif") as f:
            f.write(b"x" * 1000)
            time.sleep(0.12)
        with storage.writer("jobs/j/raw/00.npy", durable=False) as f:
            f.write(b"y")
        assert calls == expected and storage.size("jobs/j/out/a.tif") == 1000


def test_time_zone_and_log_settings_are_checked_at_start(tmp_path: Path) -> None:
    """Found from outside: STRATA_TIMEZONE=Mars/Base started, then no batch job ever ran (the admission pass failed
    every second); STRATA_LOG_LEVEL=LOUD was a traceback; STRATA_LOG_FORMAT=xml silently text."""
    for bad in ({"timezone": "Mars/Base"}, {"log_level": "LOUD"}, {"log_format": "xml"}):
        with pytest.raises(ValueError):
            Settings(data_dir=tmp_path, **bad)  # type: ignore[arg-type]
    ok = Settings(data_dir=tmp_path, timezone="Europe/Paris", log_level="debug")  # type: ignore[arg-type]
    assert ok.log_level == "DEBUG"
