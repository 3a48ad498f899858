"""Object storage against local files, through the real service (docs/PERFORMANCE.md, "Object storage").

``upload``: peak bytes under the API host's data folder while a stack (default 8 x 128 MiB = 1 GiB) is uploaded,
with local storage and with S3 (a moto server on loopback): the S3 backend streams multipart parts, so the
data folder should stay flat. ``service``: an IQ3_S frame's service time (upload to done) with local storage and
with S3, CPU workers, small scale. Each mode starts its own API (and workers), moto server, SQLite database;
Redis from STRATA_REDIS_URL (a database of its own: it is flushed).

    python -m lab.bench.storage upload --mb 1024 --frames 8
    python -m lab.bench.storage service --scale 0.05 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from lab.args import positive_float
from lab.bench.pipeline import machine
from lab.bench.service import run_job, shot_files


@contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """A moto S3 server on loopback; yields the AWS_* variables that point boto3 at it."""
    from workers.launcher import free_port

    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(endpoint + "/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_REGION": "us-east-1"}
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def service(root: Path, env: dict[str, str], workers: bool) -> Iterator[tuple[str, str]]:
    """The API (and, with ``workers``, a coordinator and CPU workers) on ``root``; yields (url, token)."""
    from services.db.migrate import upgrade
    from services.db.session import reset_engine, session_scope
    from services.stations import create_station_token
    from workers.launcher import ProcSpec, Supervisor, free_port, worker_specs

    os.environ.update(env)
    from services.config import get_settings

    get_settings.cache_clear()
    reset_engine()
    upgrade()
    with session_scope() as session:
        token = create_station_token(session, f"bench-{time.time_ns()}")
    port = free_port()
    specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                              "127.0.0.1", "--port", str(port), "--log-level", "warning"])]
    specs += worker_specs(get_settings()) if workers else []
    sup = Supervisor(specs, env=env, log_dir=root / "logs")
    sup.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, workers)
        yield url, token
    finally:
        sup.stop()


def _wait_up(url: str, workers: bool) -> None:
    for _ in range(480):
        try:
            r = httpx.get(url + ("/readyz" if workers else "/healthz"), timeout=2)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"service at {url} did not come up")


def _base_env(root: Path, backend: str, aws: dict[str, str]) -> dict[str, str]:
    import redis

    redis_url = os.environ.get("STRATA_REDIS_URL", "redis://127.0.0.1:6379/9")
    redis.Redis.from_url(redis_url).flushdb()
    env = {"STRATA_DATA_DIR": str(root / "var"), "STRATA_DATABASE_URL": f"sqlite:///{root / 'strata.db'}",
           "STRATA_REDIS_URL": redis_url, "STRATA_MIGRATE_ON_START": "false", "STRATA_LOG_LEVEL": "WARNING",
           "STRATA_TORCH_THREADS": "1", "STRATA_CPU_WORKERS": "2"}
    if backend == "s3":
        env.update(aws, STRATA_STORAGE_URL=f"s3://bench-{time.time_ns()}/studio", STRATA_S3_CREATE_BUCKET="true")
    return env


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            with contextlib.suppress(OSError):  # removed while we looked
                total += os.stat(os.path.join(dirpath, n)).st_blocks * 512  # allocated, not apparent
    return total


def _stack(folder: Path, mb: int, frames: int) -> list[Path]:
    """``frames`` valid DNGs padded to ``mb / frames`` MiB each (the probe reads only the TIFF structure)."""
    from lab.synth.synth import synthesize_shot

    synthesize_shot("IQ2_XS", folder / "src", scale=0.02, frames=2, seed=3, noise=0.0005)
    src = next((folder / "src").glob("*.dng")).read_bytes()
    paths = []
    for i in range(frames):
        path = folder / f"frame_{i:02d}.dng"
        with open(path, "wb") as f:
            f.write(src)
            f.truncate(mb * (1 << 20) // frames)
        paths.append(path)
    return paths


def upload_peak(backend: str, files: list[Path], aws: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"strata-bench-upload-{backend}-") as d:
        root = Path(d)
        with service(root, _base_env(root, backend, aws), workers=False) as (url, token):
            peak, stop = [0], threading.Event()

            def watch() -> None:
                while not stop.wait(0.02):
                    peak[0] = max(peak[0], _tree_bytes(root / "var"))

            start = _tree_bytes(root / "var")
            thread = threading.Thread(target=watch, daemon=True)
            thread.start()
            t0 = time.perf_counter()
            with httpx.Client(timeout=600) as c:
                body = [("frames", (p.name, open(p, "rb"))) for p in files]  # noqa: SIM115 - streamed by httpx
                r = c.post(url + "/v1/jobs", files=body, headers={"Authorization": f"Bearer {token}"})
            seconds = time.perf_counter() - t0
            stop.set()
            thread.join()
            if r.status_code != 202:
                raise RuntimeError(f"upload failed: {r.status_code} {r.text[:300]}")
    total = sum(p.stat().st_size for p in files)
    return {"backend": backend, "upload_bytes": total, "seconds": round(seconds, 2), "data_dir_start": start,
            "data_dir_peak": peak[0], "peak_minus_start": peak[0] - start}


def service_times(backend: str, files: list[Path], repeats: int, aws: dict[str, str]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix=f"strata-bench-service-{backend}-") as d:
        root = Path(d)
        with service(root, _base_env(root, backend, aws), workers=True) as (url, token), httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(60, read=600)
        ) as client:
            runs = []
            for run in range(repeats + 1):  # the first warms the workers
                r = run_job(client, files, 600)
                r.update(backend=backend, run=run, warm=run > 0)
                runs.append(r)
                print(f"{backend:5s} run {run}  upload {r['upload_s']:.2f} s  queued->done {r['queued_to_done_s']:.2f}"
                      f" s  processing {r['processing_s']:.2f} s", flush=True)
            return runs


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.storage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["upload", "service"])
    ap.add_argument("--mb", type=int, default=1024, help="upload: total stack size in MiB")
    ap.add_argument("--frames", type=int, default=8, help="upload: frames in the stack")
    ap.add_argument("--scale", type=positive_float, default=0.05, help="service: IQ3_S frame scale")
    ap.add_argument("--repeats", type=int, default=5, help="service: warm runs per backend")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="strata-bench-shots-") as d, moto_server() as aws:
        if args.mode == "upload":
            files = _stack(Path(d), args.mb, args.frames)
            rows = [upload_peak(b, files, aws) for b in ("local", "s3")]
            print(f"{'backend':8s} {'upload MiB':>10s} {'seconds':>8s} {'peak data-dir MiB (above start)':>32s}")
            for r in rows:
                print(f"{r['backend']:8s} {r['upload_bytes'] / 2**20:10.0f} {r['seconds']:8.2f} "
                      f"{r['peak_minus_start'] / 2**20:32.1f}")
            result: dict[str, Any] = {"mode": "upload", "rows": rows}
        else:
            files = shot_files(Path(d), "single", args.scale, 1)
            runs = {b: service_times(b, files, args.repeats, aws) for b in ("local", "s3")}
            med = {b: _median([r["queued_to_done_s"] for r in rs if r["warm"]]) for b, rs in runs.items()}
            print(f"median warm queued->done: local {med['local']:.2f} s, s3 {med['s3']:.2f} s "
                  f"({(med['s3'] / med['local'] - 1) * 100:+.0f} %)")
            result = {"mode": "service", "scale": args.scale, "median_queued_to_done_s": med, "runs": runs}
    result["machine"] = machine()
    out = args.json or Path(f"bench-storage-{args.mode}.json")
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
