"""Service benchmark: shots through a running Strata service (`strata serve`): REST upload, Redis queue, Celery
workers, storage, database. Times come from the job object the API returns, so they include everything the
pipeline benchmark leaves out (queue hops, group accumulators and strips through storage, fsyncs, stitching).

    strata serve &                       # on the GPU host: API, coordinator, one worker per GPU
    strata bench service --repeats 3     # uses the local service's URL and token

Per run: ``upload`` (client side, the POST until 202), ``processing`` (the job's started_at -> finished_at:
decode, shared parameters, every GPU phase, the TIFF) and ``queued -> done`` (created_at -> finished_at), and the
processing split from the shards' own stamps (``timeline``): ``ingest`` (job started -> first shard started: decode,
shared parameters, plan), each phase's span (its first shard started -> its last finished), the ``hop`` between
phases (dispatch of the next phase's shards) and ``finalize`` (last shard finished -> job finished: the TIFF). The
first run of each scenario also warms the workers (model load, CUDA start, decoder children); the table marks it.
Frames are the pipeline benchmark's procedural DNGs (content does not change the work).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from lab.bench.pipeline import machine, procedural_mosaic, write_frame
from services.local_service import local_service


def _stamp(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _seconds(a: str | None, b: str | None) -> float | None:
    ta, tb = _stamp(a), _stamp(b)
    return (tb - ta).total_seconds() if ta and tb else None


def timeline(job: dict[str, Any]) -> dict[str, float]:
    """Where a finished job's processing time went, from its own stamps and its shards' (see the module doc)."""
    shards = [s for s in job["shards"] if s.get("started_at") and s.get("finished_at")]
    if not shards or not job.get("started_at") or not job.get("finished_at"):
        return {}
    out: dict[str, float] = {}
    phases = sorted({s["phase"] for s in shards})
    start = min(s["started_at"] for s in shards if s["phase"] == phases[0])
    out["ingest"] = _seconds(job["started_at"], start) or 0.0
    last_end = None
    for p in phases:
        mine = [s for s in shards if s["phase"] == p]
        first, end = min(s["started_at"] for s in mine), max(s["finished_at"] for s in mine)
        if last_end is not None:
            out[f"hop {p}"] = _seconds(last_end, first) or 0.0
        out[f"phase {p} {mine[0]['kind']}"] = _seconds(first, end) or 0.0
        last_end = end
    out["finalize"] = _seconds(last_end, job["finished_at"]) or 0.0
    return out


def run_job(client: httpx.Client, files: list[Path], timeout: float) -> dict[str, Any]:
    """Upload ``files`` as one job, poll it to the end; the job's timings."""
    t0 = time.perf_counter()
    handles = [open(p, "rb") for p in files]  # noqa: SIM115 (closed below, after the upload)
    try:
        resp = client.post("/v1/jobs", data={"recipe": "tiff16"},
                           files=[("frames", (p.name, f, "application/octet-stream")) for p, f in zip(files, handles,
                                                                                                   strict=True)])
    finally:
        for f in handles:
            f.close()
    upload = time.perf_counter() - t0
    if resp.status_code != 202:
        raise RuntimeError(f"upload refused: {resp.status_code} {resp.text[:300]}")
    job = resp.json()
    deadline = time.monotonic() + timeout
    while job["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job['id']} still {job['status']} after {timeout:.0f} s")
        time.sleep(0.05)
        job = client.get(f"/v1/jobs/{job['id']}").json()
    if job["status"] != "done":
        raise RuntimeError(f"job {job['id']} {job['status']}: {job.get('error')}")
    phases: dict[str, float] = {}
    for s in job["shards"]:
        key = f"phase {s['phase']} {s['kind']} (max of {sum(x['phase'] == s['phase'] for x in job['shards'])})"
        phases[key] = max(phases.get(key, 0.0), float(s["seconds"] or 0.0))
    return {"job": job["id"], "upload_s": upload,
            "processing_s": _seconds(job["started_at"], job["finished_at"]),
            "queued_to_done_s": _seconds(job["created_at"], job["finished_at"]),
            "gpus": sorted({s["gpu"] for s in job["shards"]}), "shard_max_s": phases, "timeline_s": timeline(job)}


def _frames(tmp: Path, scenario: str, scale: float, frames: int) -> list[Path]:
    rng = np.random.default_rng(5)
    paths = []
    if scenario == "single":
        h, w = int(10304 * scale) // 2 * 2, int(7728 * scale) // 2 * 2
        write_frame(tmp / "iq3s.dng", procedural_mosaic(h, w, 1), "IQ3_S")
        return [tmp / "iq3s.dng"]
    h, w = int(7296 * scale) // 2 * 2, int(6912 * scale) // 2 * 2
    for k in range(frames):
        shift = (0.0, 0.0) if k == 0 else tuple(float(v) for v in rng.uniform(-1.5, 1.5, 2))
        path = tmp / f"iq2xs_{k:02d}.dng"
        write_frame(path, procedural_mosaic(h, w, 7, shift), "IQ2_XS")  # type: ignore[arg-type]
        paths.append(path)
    return paths


def _local_service() -> tuple[str | None, str | None]:
    found = local_service()
    token_file = found.get("token_file")
    return found.get("api_url"), Path(token_file).read_text().strip() if token_file else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="strata bench service", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api", default=None, help="API URL (default: the local `strata serve`)")
    ap.add_argument("--token", default=None, help="station token (default: the local service's)")
    ap.add_argument("--scale", type=float, default=1.0, help="linear size relative to the real sensors")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--scenarios", default="single,stack")
    ap.add_argument("--repeats", type=int, default=3, help="runs per scenario (the first also warms the workers)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, default=Path("bench-service.json"))
    args = ap.parse_args(argv)
    api, token = _local_service()
    api, token = args.api or api, args.token or token
    if not api or not token:
        ap.error("no service found: start `strata serve` or pass --api and --token")
    results = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-service-") as d, httpx.Client(
        base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(60, read=600)
    ) as client:
        for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
            folder = Path(d) / scenario
            folder.mkdir()
            files = _frames(folder, scenario, args.scale, args.frames)
            for run in range(args.repeats):
                r = run_job(client, files, args.timeout)
                r.update(scenario=scenario, run=run, warm=run > 0, frames=len(files))
                results.append(r)
                shards = ", ".join(f"{k} {v:.2f}" for k, v in r["shard_max_s"].items())
                print(f"{scenario:6s} run {run}{' (cold)' if run == 0 else '       '}  upload {r['upload_s']:6.2f} s  "
                      f"processing {r['processing_s']:6.2f} s  queued->done {r['queued_to_done_s']:6.2f} s  "
                      f"GPUs {','.join(r['gpus'])}  [{shards}]", flush=True)
                if r["timeline_s"]:
                    print("    " + ", ".join(f"{k} {v:.2f}" for k, v in r["timeline_s"].items()), flush=True)
    args.json.write_text(json.dumps({"machine": machine(), "api": api, "results": results}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
