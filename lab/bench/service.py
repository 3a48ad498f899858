"""Service benchmark: shots through a running Strata service (`strata serve`): REST upload, Redis queue, Celery
workers, storage, database. Times come from the job object the API returns, so they include everything the
pipeline benchmark leaves out (queue hops, group accumulators and strips through storage, fsyncs, stitching).

    strata serve &                       # on the GPU host: API, coordinator, one worker per GPU
    strata bench service --repeats 3     # uses the local service's URL and token

Per run: ``upload`` (client side, the POST until 202), ``processing`` (the job's started_at -> finished_at:
decode, shared parameters, every GPU phase, the TIFF) and ``queued -> done`` (created_at -> finished_at), and the
processing split from the shards' own stamps (``timeline``): ``ingest`` (decode, shared parameters, plan: the
job's ``prepare_s``), ``queue`` (the rest of job started -> first shard started: dispatch and the wait for a GPU
worker slot; before 2026-12-03 ``ingest`` held both), each phase's span (its first shard started -> its last
finished), the ``hop`` between phases (dispatch of the next phase's shards) and ``finalize`` (last shard
finished -> job finished: the TIFF; ``finalize_split`` its parts from the job's own timings: wait, read, encode,
rest). The first run of each scenario also warms the workers (model load, CUDA
start, decoder children); the table marks it.
Frames are the pipeline benchmark's procedural DNGs (content does not change the work).

Scenarios (``--scenarios``): ``single`` (an IQ3_S frame), ``stack4`` / ``stack8`` (IQ2_XS stacks), ``stack``
(``--frames`` frames), each ``--repeats`` times, reported as the warm runs' median and spread; ``batch``
(``--batch-size`` IQ3_S shots at batch priority, uploaded by ``--upload-threads`` threads, throughput over the
span from the first job started to the last one finished, and the sustained rate, (N - 1) over the span from the
first job finished to the last, which leaves out the pipeline's fill (:func:`sustained_rate`), with the
resources over that window too (``resources_sustained``);
``--interactive-during-batch`` adds one interactive shot, ``--interactive-shots N`` up to N one after another while
the batch runs, and compares their median latency with the idle ``single`` runs).
During every scenario a sampler (:mod:`lab.bench.sampler`) records GPU busy fractions and GPU memory per process
(NVML) and CPU busy fraction and host memory (psutil), every 250 ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from lab.args import positive_float
from lab.bench.pipeline import machine, procedural_mosaic, write_frame
from lab.bench.sampler import ResourceSampler, busy_summary, cpu_summary
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
    waited = _seconds(job["started_at"], start) or 0.0
    prepare = float((job.get("timings") or {}).get("prepare_s") or 0.0)  # the ingest's own time, where recorded
    out["ingest"] = min(prepare, waited) if prepare else waited
    if prepare and waited > prepare:
        out["queue"] = waited - prepare  # dispatched, waiting for a GPU worker slot
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


FINALIZE_PARTS = (("wait", "finalize_wait_s"), ("read", "finalize_read_s"), ("encode", "encode_s"))


def finalize_split(job: dict[str, Any], finalize: float) -> dict[str, float]:
    """The finalize's parts from the job's own timings, where its coordinator recorded them (since session 41):
    ``wait`` (last strip finished -> finalize began), ``read`` (strips found and read back), ``encode`` (every
    output written and fsync'd) and ``rest`` (the outputs' record up to the job's finished stamp, and clock skew
    between the worker's and the coordinator's stamps)."""
    timings = job.get("timings") or {}
    if "finalize_read_s" not in timings:
        return {}
    out = {name: float(timings[key]) for name, key in FINALIZE_PARTS if key in timings}
    out["rest"] = round(finalize - sum(out.values()), 4)
    return out


def upload_job(client: httpx.Client, files: list[Path], recipes: Sequence[str] = ("tiff16",),
               priority: str = "interactive", into: dict[str, Any] | None = None) -> tuple[dict[str, Any], float]:
    """POST ``files`` as one job (``into``: a shot of that batch, which sets its recipes and priority); (the job
    as answered, upload seconds)."""
    t0 = time.perf_counter()
    handles = [open(p, "rb") for p in files]  # noqa: SIM115 (closed below, after the upload)
    try:
        data: dict[str, Any] = {} if into else {"recipe": list(recipes), "priority": priority}
        resp = client.post(f"/v1/batches/{into['id']}/shots" if into else "/v1/jobs", data=data,
                           files=[("frames", (p.name, f, "application/octet-stream"))
                                  for p, f in zip(files, handles, strict=True)])
    finally:
        for f in handles:
            f.close()
    if resp.status_code != 202:
        raise RuntimeError(f"upload refused: {resp.status_code} {resp.text[:300]}")
    return resp.json(), time.perf_counter() - t0


def wait_job(client: httpx.Client, job: dict[str, Any], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while job["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job['id']} still {job['status']} after {timeout:.0f} s")
        time.sleep(0.05)
        job = client.get(f"/v1/jobs/{job['id']}").json()
    if job["status"] != "done":
        raise RuntimeError(f"job {job['id']} {job['status']}: {job.get('error')}")
    return job


def job_timings(job: dict[str, Any], upload: float) -> dict[str, Any]:
    """A finished job's timings: upload, processing (started -> finished), queued -> done, shards, timeline."""
    phases: dict[str, float] = {}
    line = timeline(job)
    for s in job["shards"]:
        key = f"phase {s['phase']} {s['kind']} (max of {sum(x['phase'] == s['phase'] for x in job['shards'])})"
        phases[key] = max(phases.get(key, 0.0), float(s["seconds"] or 0.0))
    return {"job": job["id"], "upload_s": upload,
            "processing_s": _seconds(job["started_at"], job["finished_at"]),
            "queued_to_done_s": _seconds(job["created_at"], job["finished_at"]),
            "gpus": sorted({s["gpu"] for s in job["shards"]}), "shard_max_s": phases, "timeline_s": line,
            "finalize_split_s": finalize_split(job, line.get("finalize", 0.0)),
            "shards_by_gpu": {g: sum(1 for s in job["shards"] if s["gpu"] == g)
                              for g in sorted({s["gpu"] for s in job["shards"]})}}


def _p95(values: list[float]) -> float:
    """The 95th percentile, linearly interpolated between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    at = 0.95 * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def wait_preview(client: httpx.Client, job_id: str, timeout: float) -> float | None:
    """Seconds from now until ``GET /v1/jobs/{id}/preview`` first answers 200 (polled every 20 ms); None if the job
    ends or ``timeout`` passes first. Called right after the upload returned: the issue's "preview available after
    the upload completes"."""
    t0 = time.perf_counter()
    polls = 0
    while time.perf_counter() - t0 < timeout:
        r = client.get(f"/v1/jobs/{job_id}/preview")
        if r.status_code == 200:
            return time.perf_counter() - t0
        polls += 1
        if polls % 10 == 0 and client.get(f"/v1/jobs/{job_id}").json().get("status") not in ("queued", "running"):
            final = client.get(f"/v1/jobs/{job_id}/preview")  # done meanwhile: its preview may have just come
            return time.perf_counter() - t0 if final.status_code == 200 else None  # else failed or cancelled
        time.sleep(0.02)
    return None


def run_job(client: httpx.Client, files: list[Path], timeout: float,
            recipes: Sequence[str] = ("tiff16",)) -> dict[str, Any]:
    """Upload ``files`` as one job, time its preview, poll it to the end; the job's timings."""
    job, upload = upload_job(client, files, recipes)
    preview = wait_preview(client, job["id"], min(timeout, 30.0))
    return {**job_timings(wait_job(client, job, timeout), upload), "preview_after_upload_s": preview}


SCENARIO_FRAMES = {"single": 1, "stack4": 4, "stack8": 8}


def shot_files(tmp: Path, scenario: str, scale: float, frames: int) -> list[Path]:
    """The DNGs of a scenario: one IQ3_S frame (``single``, ``batch``) or an IQ2_XS stack (``stack4``,
    ``stack8``, ``stack`` = ``frames`` frames); procedural content (it does not change the work)."""
    n = SCENARIO_FRAMES.get(scenario, 1 if scenario == "batch" else frames)
    tmp.mkdir(parents=True, exist_ok=True)
    if n == 1:
        h, w = int(10304 * scale) // 2 * 2, int(7728 * scale) // 2 * 2
        write_frame(tmp / "iq3s.dng", procedural_mosaic(h, w, 1), "IQ3_S")
        return [tmp / "iq3s.dng"]
    rng = np.random.default_rng(5)
    h, w = int(7296 * scale) // 2 * 2, int(6912 * scale) // 2 * 2
    paths = []
    for k in range(n):
        shift = (0.0, 0.0) if k == 0 else tuple(float(v) for v in rng.uniform(-1.5, 1.5, 2))
        path = tmp / f"iq2xs_{k:02d}.dng"
        write_frame(path, procedural_mosaic(h, w, 7, shift, noise_seed=100 + k), "IQ2_XS")  # type: ignore[arg-type]
        paths.append(path)
    return paths


def latency_scenario(client: httpx.Client, sampler: ResourceSampler, scenario: str, files: list[Path],
                     args: argparse.Namespace) -> dict[str, Any]:
    """``repeats`` jobs one after the other: each run's timings, the warm runs' median and spread, busy fractions."""
    runs = []
    t0 = time.monotonic()
    for run in range(args.repeats):
        r = run_job(client, files, args.timeout, args.recipe)
        r.update(run=run, warm=run > 0)
        runs.append(r)
        shards = ", ".join(f"{k} {v:.2f}" for k, v in r["shard_max_s"].items())
        print(f"{scenario:6s} run {run}{' (cold)' if run == 0 else '       '}  upload {r['upload_s']:6.2f} s  "
              f"processing {r['processing_s']:6.2f} s  queued->done {r['queued_to_done_s']:6.2f} s  "
              f"GPUs {','.join(r['gpus'])}  [{shards}]", flush=True)
        if r["timeline_s"]:
            parts = "".join(f" {k} {v:.2f}" for k, v in r.get("finalize_split_s", {}).items())
            print("    " + ", ".join(f"{k} {v:.2f}" for k, v in r["timeline_s"].items()) +
                  (f" (of which{parts})" if parts else "") +
                  (f"; preview {r['preview_after_upload_s']:.3f} s after the upload"
                   if r["preview_after_upload_s"] is not None else ""), flush=True)
    warm = [r["processing_s"] for r in runs if r["warm"]] or [runs[0]["processing_s"]]
    previews = [r["preview_after_upload_s"] for r in runs if r["warm"] and r["preview_after_upload_s"] is not None]
    return {"scenario": scenario, "preview_after_upload_median_s": statistics.median(previews) if previews else None,
            "preview_after_upload_max_s": max(previews) if previews else None,
            "preview_after_upload_p95_s": _p95(previews) if previews else None, "frames": len(files), "runs": runs,
            "processing_median_s": statistics.median(warm),
            "processing_min_s": min(warm), "processing_max_s": max(warm),
            "frames_per_s": len(files) / statistics.median(warm), "resources": sampler.window(t0, time.monotonic())}


def batch_scenario(client: httpx.Client, sampler: ResourceSampler, files: list[Path],
                   args: argparse.Namespace, idle_latency: float | None) -> dict[str, Any]:
    """``batch_size`` IQ3_S shots at batch priority, uploaded by a few threads; throughput over the span from the
    first job started to the last one finished; optionally one interactive shot submitted mid-batch."""
    t0 = time.monotonic()
    ahead = _upload_ahead_batch(client, args) if args.upload_ahead else None
    with ThreadPoolExecutor(args.upload_threads) as pool:
        uploads = list(pool.map(lambda _: upload_job(client, files, args.recipe, "batch", into=ahead),
                                range(args.batch_size)))
        if ahead is not None:
            _await_window(ahead, uploads)
            t0 = time.monotonic()  # resources from the window's opening: the render alone
        interactive, batch_over = None, threading.Event()
        if args.interactive_during_batch:
            interactive = pool.submit(_interactive_shots, client, files, args, batch_over)
        done = [_finished(client, job, args) for job, _ in uploads]
        batch_over.set()
        inter = _interactive_summary(interactive.result()) if interactive else None
    first = min(_stamp(j["started_at"]) for j in done)  # type: ignore[type-var]
    last = max(_stamp(j["finished_at"]) for j in done)  # type: ignore[type-var]
    span = (last - first).total_seconds()  # type: ignore[operator]
    result = {"scenario": "batch", "shots": len(done), "render_span_s": span, "frames_per_s": len(done) / span,
              "uploaded_ahead": ahead is not None,
              **sustained_rate([_stamp(j["finished_at"]) for j in done]),  # type: ignore[misc]
              "upload_span_s": sum(u for _, u in uploads) / args.upload_threads, "recipes": list(args.recipe),
              "shards_by_gpu": _count_shards(done), "resources": sampler.window(t0, time.monotonic()),
              "resources_sustained": sustained_window(sampler, [_stamp(j["finished_at"]) for j in done])}
    if inter is not None:
        result["interactive_during_batch"] = {**inter, "idle_latency_s": idle_latency,
                                              "ratio_to_idle": (inter["queued_to_done_s"] / idle_latency
                                                                if idle_latency else None)}
    print(f"batch  {len(done)} shots  render span {span:6.2f} s  {result['frames_per_s']:.2f} frames/s "
          f"(sustained {_fmt(result['sustained_frames_per_s'])})  {busy_summary(result['resources'])}", flush=True)
    print(f"       {cpu_summary(result['resources'], len(done))}", flush=True)
    print(f"       from the first shot done to the last: {busy_summary(result['resources_sustained'])}", flush=True)
    if inter is not None:
        runs = inter["queued_to_done_runs_s"]
        spread = f" (median of {len(runs)}: {min(runs):.2f}-{max(runs):.2f} s)" if len(runs) > 1 else ""
        print(f"       interactive during the batch: queued->done {inter['queued_to_done_s']:.2f} s{spread} "
              f"(idle {idle_latency or float('nan'):.2f} s)", flush=True)
    return result


def _interactive_shots(client: httpx.Client, files: list[Path], args: argparse.Namespace,
                       batch_over: threading.Event) -> list[dict[str, Any]]:
    """``--interactive-shots`` interactive IQ3_S shots, one after another (1 s apart, the first 1 s after the
    batch's uploads), while the batch runs: the first always, the others only while it is not over."""
    runs: list[dict[str, Any]] = []
    for i in range(max(1, args.interactive_shots)):
        if batch_over.wait(1.0) and i:
            break
        runs.append(run_job(client, files, args.timeout, args.recipe))
    return runs


def _interactive_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The interactive shots' timings: the median shot's fields (``queued_to_done_s`` is the median), with every
    shot's queued->done."""
    ordered = sorted(runs, key=lambda r: r["queued_to_done_s"])
    median = ordered[(len(ordered) - 1) // 2]
    return {**median, "queued_to_done_s": statistics.median(r["queued_to_done_s"] for r in runs),
            "queued_to_done_runs_s": [r["queued_to_done_s"] for r in runs]}


def _finished(client: httpx.Client, job: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Wait for a batch job; with ``--remove-files`` then remove its uploads and outputs (a long batch on a small
    disk; a studio that has copied its TIFFs off does the same)."""
    done = wait_job(client, job, args.timeout)
    if args.remove_files:
        resp = client.delete(f"/v1/jobs/{job['id']}/files")
        if resp.status_code != 200:
            raise RuntimeError(f"removing job {job['id']}'s files failed: {resp.status_code} {resp.text[:300]}")
    return done


def _upload_ahead_batch(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    """A batch whose window opens once the shots should be uploaded (a studio's night: shots uploaded during the
    day, rendered later), so the render does not share the disk with the uploads; its opening time is a guess
    from the shots' count (an 80 MP upload took 0.5 s alone, 1.2-1.4 s a thread with four threads on the H200
    host's disk: 1.5 s a shot per thread, plus 10 s), and :func:`_await_window` says when the guess was short."""
    opens = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=10 + 1.5 * args.batch_size / max(args.upload_threads, 1))
    resp = client.post("/v1/batches", json={"name": "bench upload-ahead", "recipes": list(args.recipe),
                                            "not_before": opens.isoformat()})
    if resp.status_code != 201:
        raise RuntimeError(f"batch refused: {resp.status_code} {resp.text[:300]}")
    return {**resp.json(), "opens": opens}


def _await_window(batch: dict[str, Any], uploads: list[tuple[dict[str, Any], float]]) -> None:
    """Sleep until the batch's window opens; warn when the uploads ran past it (they then overlapped the render)."""
    left = (batch["opens"] - dt.datetime.now(dt.UTC)).total_seconds()
    if left < 0:
        print(f"warning: the uploads ended {-left:.1f} s after the batch's window opened (the render shared the disk "
              f"with them)", flush=True)
    time.sleep(max(0.0, left))
    print(f"{len(uploads)} shots uploaded ahead; the batch's window is open", flush=True)


def sustained_rate(finished: Sequence[dt.datetime]) -> dict[str, float | None]:
    """The batch's sustained rate: jobs finished per second between the first and the last finish, (N - 1) /
    (last - first), so the pipeline's fill (the first job's own latency, when nothing has finished yet) is left
    out. The span rate (``frames_per_s``) counts the fill, and so understates what a long batch sustains, the more
    the shorter the batch: a 24-shot batch at 3 frames/s spends a fifth of its span filling."""
    ends = sorted(finished)
    if len(ends) < 2 or ends[-1] <= ends[0]:
        return {"sustained_frames_per_s": None, "finish_span_s": None}
    window = (ends[-1] - ends[0]).total_seconds()
    return {"sustained_frames_per_s": (len(ends) - 1) / window, "finish_span_s": window}


def sustained_window(sampler: ResourceSampler, finished: Sequence[dt.datetime | None]) -> dict[str, Any]:
    """The resources over the sustained rate's window (the first job finished -> the last): busy fractions without
    the pipeline's fill (the first shots' ingest, the GPU idle) and the tail after the last job (interactive shots
    still running), which dilute the whole span's means. The jobs' wall-clock stamps are put on the sampler's
    monotonic clock (the service runs on this host); empty when fewer than two jobs finished."""
    ends = sorted(e if e.tzinfo else e.replace(tzinfo=dt.UTC) for e in finished if e is not None)  # naive: UTC
    if len(ends) < 2:
        return {}
    offset = time.time() - time.monotonic()
    return sampler.window(ends[0].timestamp() - offset, ends[-1].timestamp() - offset)


def _fmt(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.2f} frames/s"


def _count_shards(jobs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in jobs:
        for s in job["shards"]:
            counts[s["gpu"]] = counts.get(s["gpu"], 0) + 1
    return dict(sorted(counts.items()))


def _local_service(data_dir: Path | None) -> tuple[str | None, str | None]:
    env = os.environ.get("STRATA_DATA_DIR")
    found = local_service(data_dir or (Path(env) if env else None))
    token_file = found.get("token_file")
    return found.get("api_url"), Path(token_file).read_text().strip() if token_file else None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="strata bench service", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api", default=None, help="API URL (default: the local `strata serve`)")
    ap.add_argument("--token", default=None, help="station token (default: the local service's)")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="data directory of the `strata serve` to use (default STRATA_DATA_DIR, ./var, the last one)")
    ap.add_argument("--scale", type=positive_float, default=1.0, help="linear size relative to the real sensors")
    ap.add_argument("--frames", type=int, default=8, help="frames of the `stack` scenario")
    ap.add_argument("--scenarios", default="single,stack",
                    help="comma list of single, stack4, stack8, stack (--frames), batch")
    ap.add_argument("--repeats", type=int, default=3, help="runs per scenario (the first also warms the workers)")
    ap.add_argument("--batch-size", type=int, default=12, help="IQ3_S shots of the batch scenario")
    ap.add_argument("--upload-threads", type=int, default=4, help="concurrent uploads in the batch scenario")
    ap.add_argument("--upload-ahead", action="store_true",
                    help="batch: upload the shots into a batch whose window opens after the uploads (a studio's "
                         "night), so only the render is timed and sampled; default: jobs render as they arrive")
    ap.add_argument("--remove-files", action="store_true",
                    help="remove each batch job's uploads and outputs once it is done (DELETE /v1/jobs/{id}/files): "
                         "a batch larger than the disk")
    ap.add_argument("--interactive-during-batch", action="store_true",
                    help="submit an interactive IQ3_S shot 1 s after the batch's uploads and time it")
    ap.add_argument("--interactive-shots", type=int, default=1,
                    help="with --interactive-during-batch: up to N interactive shots one after another while the "
                         "batch runs; the median is reported")
    ap.add_argument("--recipe", action="append", default=None, help="recipe(s) of every job (default tiff16)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, default=Path("bench-service.json"))
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    args.recipe = args.recipe or ["tiff16"]
    api, token = _local_service(args.data_dir)
    api, token = args.api or api, args.token or token
    if not api or not token:
        ap.error("no service found: start `strata serve` or pass --api and --token")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in (*SCENARIO_FRAMES, "stack", "batch")]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from single, stack4, stack8, stack, batch")
    sampler = ResourceSampler().start()
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="strata-bench-service-") as d, httpx.Client(
            base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(60, read=600)
        ) as client:
            idle: float | None = None
            for scenario in scenarios:
                files = shot_files(Path(d) / scenario, scenario, args.scale, args.frames)
                if scenario == "batch":
                    results.append(batch_scenario(client, sampler, files, args, idle))
                    continue
                results.append(latency_scenario(client, sampler, scenario, files, args))
                if scenario == "single":
                    idle = statistics.median(r["queued_to_done_s"] for r in results[-1]["runs"] if r["warm"]
                                             ) if args.repeats > 1 else results[-1]["runs"][0]["queued_to_done_s"]
    finally:
        sampler.stop()
    print_summary(results)
    args.json.write_text(json.dumps({"machine": machine(), "api": api, "gpus_sampled": sampler.gpus,
                                     "scenarios": results}, indent=2))
    print(f"wrote {args.json}")
    return 0


def print_summary(results: list[dict[str, Any]]) -> None:
    print(f"\n{'scenario':<8} {'frames':>6} {'median s':>9} {'min-max s':>13} {'frames/s':>9}  resources")
    for r in results:
        if r["scenario"] == "batch":
            print(f"{'batch':<8} {r['shots']:>6} {'':>9} {'':>13} {r['frames_per_s']:>9.2f}  "
                  f"sustained {_fmt(r.get('sustained_frames_per_s'))}, {busy_summary(r['resources'])}")
            print(f"{'':<8} {cpu_summary(r['resources'], r['shots'])}")
            if r.get("resources_sustained"):
                print(f"{'':<8} first shot done -> last: {busy_summary(r['resources_sustained'])}")
            continue
        print(f"{r['scenario']:<8} {r['frames']:>6} {r['processing_median_s']:>9.2f} "
              f"{r['processing_min_s']:>6.2f}-{r['processing_max_s']:<6.2f} {r['frames_per_s']:>9.2f}  "
              f"{busy_summary(r['resources'])}")
        print(f"{'':<8} {cpu_summary(r['resources'], r['frames'] * len(r['runs']))} (cold run included)")
        if r.get("preview_after_upload_median_s") is not None:
            print(f"{'':<8} preview available {r['preview_after_upload_median_s']:.3f} s after the upload "
                  f"(median of the warm runs; p95 {r['preview_after_upload_p95_s']:.3f} s, "
                  f"max {r['preview_after_upload_max_s']:.3f} s)")


if __name__ == "__main__":
    raise SystemExit(main())
