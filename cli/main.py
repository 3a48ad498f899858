"""The `strata` command line: serve, workers, coordinator, submit, jobs, synth, token, db, bench, quality."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from services.config import get_settings
from services.local_service import local_service, remember_local_service

app = typer.Typer(help="Strata: asynchronous RAW render service.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
token_app = typer.Typer(help="Station and admin tokens.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
jobs_app = typer.Typer(help="This station's jobs: list, show, cancel, download.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")
console = Console(stderr=True)

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ./var or STRATA_DATA_DIR).")]


def _use_data_dir(data_dir: Path | None, create: bool = True) -> Path:
    """Point the settings (and every child process) at ``data_dir``."""
    if data_dir is not None:
        os.environ["STRATA_DATA_DIR"] = str(data_dir.resolve())
        get_settings.cache_clear()
    settings = get_settings()
    if create:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings.data_dir


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@db_app.command("upgrade")
def db_upgrade(data_dir: DataDir = None) -> None:
    """Create or upgrade the database schema (Alembic)."""
    _use_data_dir(data_dir)
    from services.db.migrate import upgrade

    upgrade()
    console.print("database is at the latest revision")


@token_app.command("create")
def token_create(
    station: Annotated[str | None, typer.Option("--station", help="Capture station name.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Principal name (with --admin).")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="A studio admin: sees and acts on every station's work.")]
    = False,
    data_dir: DataDir = None,
    rotate: Annotated[bool, typer.Option("--rotate", help="Replace the token of an existing station.")] = False,
) -> None:
    """Create a capture station (or, with --admin, an admin) and print its token (shown once, stored hashed) on the
    last line."""
    who = (name or station or "").strip()
    if not who:
        raise _fail("give --station NAME (or --admin --name NAME)")
    _use_data_dir(data_dir)
    from services.db.migrate import upgrade
    from services.db.session import session_scope
    from services.errors import StrataError
    from services.stations import create_station_token

    upgrade()
    try:
        with session_scope() as session:
            token = create_station_token(session, who, replace=rotate, role="admin" if admin else "station")
    except StrataError as exc:
        raise _fail(exc.detail) from exc
    console.print(f"{'admin' if admin else 'station'} {who!r}: keep this token, it is not shown again")
    print(token)


@token_app.command("list")
def token_list(data_dir: DataDir = None) -> None:
    """Every station and admin: name, role, created, revoked."""
    _use_data_dir(data_dir)
    from services.db.migrate import upgrade
    from services.db.session import session_scope
    from services.stations import list_tokens

    upgrade()
    with session_scope() as session:
        tokens = list_tokens(session)
    for t in tokens:  # tab-separated: name, role, created, live|revoked
        print(f"{t.name}\t{t.role}\t{t.created_at}\t{'revoked' if t.revoked else 'live'}")


@token_app.command("revoke")
def token_revoke(name: str, data_dir: DataDir = None) -> None:
    """Revoke NAME's token: refused from now on (its jobs stay)."""
    _use_data_dir(data_dir)
    from services.db.migrate import upgrade
    from services.db.session import session_scope
    from services.errors import StrataError
    from services.stations import revoke_token

    upgrade()
    try:
        with session_scope() as session:
            revoke_token(session, name)
    except StrataError as exc:
        raise _fail(exc.detail) from exc
    console.print(f"revoked {name!r}")


def ensure_local_token() -> Path:
    """The embedded setup's station token: created on first start, kept in <data-dir>/local-token."""
    from services.db.session import session_scope
    from services.errors import Unauthorized
    from services.stations import authenticate, create_station_token

    settings = get_settings()
    path = settings.token_file
    if path.exists():
        with session_scope() as session:
            try:
                authenticate(session, path.read_text().strip())
                return path
            except Unauthorized:
                pass
    with session_scope() as session:
        token = create_station_token(session, "local", replace=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="API bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    data_dir: DataDir = None,
    workers: Annotated[bool, typer.Option(help="Also start the coordinator and GPU workers.")] = True,
) -> None:
    """Run everything on this machine: API, coordinator, one worker per GPU, and Redis if none is configured."""
    import httpx

    from services.db.migrate import upgrade
    from workers.launcher import ProcSpec, Supervisor, free_port, redis_spec, worker_specs

    data = _use_data_dir(data_dir).resolve()
    os.environ["STRATA_DATA_DIR"] = str(data)
    settings = get_settings()
    specs: list[ProcSpec] = []
    redis_proc = None
    if not settings.redis_url:
        rport = free_port()
        redis_proc = Supervisor([redis_spec(data, rport)], log_dir=data / "logs")
        redis_proc.start()
        os.environ["STRATA_REDIS_URL"] = f"redis://127.0.0.1:{rport}/0"
        get_settings.cache_clear()
        settings = get_settings()
        _wait_redis(settings.redis_url or "", 15)
        console.print(f"started a private Redis on 127.0.0.1:{rport} (data in {data / 'redis'})")
    upgrade()
    token_path = ensure_local_token()
    specs.append(ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory",
                                  "--host", host, "--port", str(port), "--log-level", "warning"],
                          {"STRATA_MIGRATE_ON_START": "false"}))
    if workers:
        specs += worker_specs(settings)
    from services.metrics import reset_multiproc_dir

    reset_multiproc_dir()  # counters of an earlier run's processes
    sup = Supervisor(specs, log_dir=data / "logs")
    sup.start()
    url = f"http://{host}:{port}"
    remember_local_service(f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}", token_path)
    console.print(f"Strata API on {url} (docs at {url}/docs); logs in {data / 'logs'}")
    console.print(f"local station token: {token_path}")
    ready = False
    for _ in range(120):
        try:
            ready = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready:
            break
        time.sleep(0.5)
    console.print("[green]ready[/green]" if ready else "[yellow]not ready yet; see /readyz and the logs[/yellow]")
    try:
        sup.run_forever()
    finally:
        if redis_proc is not None:
            redis_proc.stop()
        console.print("stopped")


def _wait_redis(url: str, timeout: float) -> None:
    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@app.command("workers")
def workers_cmd(
    gpus: Annotated[str | None, typer.Option(help="GPU ids, e.g. 0,1 (default: STRATA_GPU_ID or all).")] = None,
    coordinator: Annotated[bool, typer.Option(help="Also run a coordinator on this host.")] = False,
    gpu_workers: Annotated[bool, typer.Option("--gpu-workers/--no-gpu-workers")] = True,
    data_dir: DataDir = None,
) -> None:
    """Start one Celery worker per GPU (pinned with CUDA_VISIBLE_DEVICES), supervised; CPU worker(s) without GPUs."""
    from workers.launcher import Supervisor, worker_specs

    _use_data_dir(data_dir)
    settings = get_settings()
    ids = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
    specs = worker_specs(settings, gpus=ids, coordinator=coordinator, gpu_workers=gpu_workers)
    for s in specs:
        console.print(f"{s.name}: CUDA_VISIBLE_DEVICES={s.env.get('CUDA_VISIBLE_DEVICES', '-')}")
    Supervisor(specs).run_forever()


@app.command()
def coordinator(data_dir: DataDir = None) -> None:
    """Start the coordinator worker (decode, plan, finalize/TIFF) on this host."""
    workers_cmd(gpus=None, coordinator=True, gpu_workers=False, data_dir=data_dir)


@app.command()
def synth(
    camera: Annotated[str, typer.Option(help="IQ3_S or IQ2_XS.")] = "IQ3_S",
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("synth"),
    scale: Annotated[float, typer.Option(help="Linear size relative to the real sensor.")] = 0.1,
    frames: Annotated[int | None, typer.Option(help="Frames in a stack (IQ2_XS, default 4).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    noise: Annotated[str, typer.Option(help="none|low|mid|high or a shot-noise number (0 = noise-free).")] = "low",
    cfa: Annotated[str, typer.Option(help="RGGB, BGGR, GRBG or GBRG.")] = "RGGB",
    content: Annotated[str, typer.Option(help="dead_leaves, photo:NNN, skimage:NAME or an image path.")]
    = "dead_leaves",
    space: Annotated[str, typer.Option(help="Ground truth's output space: srgb, adobergb, prophoto, linear.")]
    = "srgb",
    photos_dir: Annotated[Path | None, typer.Option(help="Folder of photo:NNN images.")] = None,
    max_shift: Annotated[float, typer.Option(help="Stacks: largest random frame shift in pixels.")] = 1.5,
    moving_object: Annotated[bool, typer.Option(
        help="Stacks: a disc moves in the last frame (its region is saved as motion_mask.png).")] = False,
    pixel_shift: Annotated[bool, typer.Option(help="Stacks: 4 frames in a one-pixel pixel-shift pattern.")] = False,
) -> None:
    """Write realistic synthetic DNGs plus the ground truth they were made from."""
    from lab.synth.synth import synthesize_shot

    try:
        level: str | float = float(noise)
    except ValueError:
        level = noise
    extra: dict[str, Any] = {"photos_dir": photos_dir} if photos_dir else {}
    try:
        if moving_object or pixel_shift:
            files, truth = _synth_stack_scene(camera, out, scale=scale, frames=frames, seed=seed, noise=level,
                                              cfa=cfa.upper(), content=content, space=space, max_shift=max_shift,
                                              moving_object=moving_object, pixel_shift=pixel_shift, **extra)
        else:
            shot = synthesize_shot(camera.upper(), out, scale=scale, frames=frames, seed=seed, noise=level,
                                   cfa=cfa.upper(), content=content, space=space, max_shift=max_shift, **extra)
            files, truth = shot.files, shot.ground_truth
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc), 2) from exc
    for f in files:
        print(f)
    console.print(f"ground truth: {truth}")


def _synth_stack_scene(camera: str, out: Path, *, frames: int | None, noise: str | float, space: str,
                       moving_object: bool, pixel_shift: bool, **kwargs: Any) -> tuple[list[Path], Path]:
    """A stack with a moving object or in a pixel-shift pattern (the stack benchmark's generator)."""
    import numpy as np
    from PIL import Image

    from lab.synth.stack_synth import synthesize_stack
    from lab.synth.unprocess import noise_level

    if camera.upper() != "IQ2_XS":
        raise ValueError(f"--moving-object and --pixel-shift make IQ2_XS stacks, not {camera}")
    if space != "srgb":
        raise ValueError("--moving-object and --pixel-shift write an sRGB ground truth only")
    shot = synthesize_stack(out, frames=frames or 4, noise=noise_level(noise).shot, moving_object=moving_object,
                            pixel_shift=pixel_shift, **kwargs)
    if moving_object:
        Image.fromarray(shot.motion_mask.astype(np.uint8) * 255).save(out / "motion_mask.png")
    return shot.files, shot.ground_truth


@app.command()
def submit(
    files: Annotated[list[Path], typer.Argument(help="RAW file(s) of one shot.", exists=True, dir_okay=False)],
    camera: Annotated[str | None, typer.Option(help="IQ3_S or IQ2_XS (default: detect).")] = None,
    recipe: Annotated[str, typer.Option(help="Output recipe.")] = "tiff16",
    priority: Annotated[str, typer.Option(help="interactive or batch.")] = "interactive",
    wait: Annotated[bool, typer.Option(help="Wait for the job and download its outputs.")] = True,
    out: Annotated[Path, typer.Option("--out", help="Where to save outputs.")] = Path("."),
    api: Annotated[str | None, typer.Option(help="API URL (default STRATA_API_URL or local).")] = None,
    token: Annotated[str | None, typer.Option(help="Station token (default STRATA_TOKEN or local).")] = None,
    data_dir: DataDir = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the job.")] = 3600,
) -> None:
    """Upload a shot with a progress bar, wait for it, download the TIFF(s)."""
    from cli.client import SubmitError, submit_shot

    url, tok = _api_token(api, token, data_dir)
    try:
        paths = submit_shot(url, tok, files, camera=camera, recipe=recipe,
                            priority=priority, wait=wait, out_dir=out, timeout=timeout, console=console)
    except SubmitError as exc:
        raise _fail(str(exc)) from exc
    for p in paths:
        print(p)


def _api_token(api: str | None, token: str | None, data_dir: Path | None) -> tuple[str, str]:
    """The API URL and station token: the options, else STRATA_API_URL / STRATA_TOKEN / the token file, else the
    local `strata serve`'s."""
    _use_data_dir(data_dir, create=False)
    settings = get_settings()
    local = local_service()
    tok = token or settings.token
    if not tok and settings.token_file.exists():
        tok = settings.token_file.read_text().strip()
    if not tok and local.get("token_file") and Path(local["token_file"]).exists():
        tok = Path(local["token_file"]).read_text().strip()
        api = api or (None if "api_url" in settings.model_fields_set else local.get("api_url"))
    if not tok:
        raise _fail(f"no token: pass --token, set STRATA_TOKEN, or run `strata serve` (it writes "
                    f"{settings.token_file})")
    return api or settings.api_url, tok


ApiOpt = Annotated[str | None, typer.Option(help="API URL (default STRATA_API_URL or local).")]
TokenOpt = Annotated[str | None, typer.Option(help="Station token (default STRATA_TOKEN or local).")]


def _stdout() -> Console:
    """Results go to stdout (progress and messages to stderr); piped or redirected, 200 columns wide, so job ids
    and names are not cut to 80."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def _duration(job: dict[str, Any]) -> str:
    if not job.get("started_at"):
        return "-"
    import datetime as dt

    start = dt.datetime.fromisoformat(job["started_at"])
    end = dt.datetime.fromisoformat(job["finished_at"]) if job.get("finished_at") else dt.datetime.now(dt.UTC)
    return f"{(end - start).total_seconds():.1f} s"


def _api_call(api: str | None, token: str | None, data_dir: Path | None, method: str, path: str,
              **kwargs: Any) -> Any:
    """One call to the station's API (URL and token resolved as for `strata submit`); a clean exit on error."""
    from cli.client import SubmitError, call, connect

    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            return call(client, method, path, **kwargs)
    except SubmitError as exc:
        raise _fail(str(exc)) from exc


@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="queued, running, done, failed or cancelled.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="How many, newest first.")] = 20,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """This station's jobs, newest first."""
    from rich.table import Table

    params: dict[str, str | int] = {"limit": limit} | ({"status": status} if status else {})
    jobs = _api_call(api, token, data_dir, "GET", "/v1/jobs", params=params)["jobs"]
    table = Table("job", "status", "stage", "progress", "camera", "frames", "created (UTC)", "time", "output")
    for j in jobs:
        table.add_row(j["id"], j["status"], j["stage"], f"{j['progress']:.0%}", j["camera"], str(len(j["frames"])),
                      j["created_at"][:19].replace("T", " "), _duration(j),
                      ", ".join(o["name"] for o in j["outputs"]) or (j.get("error") or "")[:40])
    _stdout().print(table)


@jobs_app.command("show")
def jobs_show(job_id: str, api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None) -> None:
    """One job: status, frames, shards (worker, GPU, seconds), outputs, error."""
    from rich.table import Table

    j = _api_call(api, token, data_dir, "GET", f"/v1/jobs/{job_id}")
    out = _stdout()
    out.print(f"job {j['id']}: {j['status']} ({j['stage']}, {j['progress']:.0%}), {j['camera']}, "
              f"recipe {j['recipe']}, priority {j['priority']}, time {_duration(j)}")
    out.print("frames: " + ", ".join(f["name"] for f in j["frames"]))
    if j["shards"]:
        table = Table("phase", "shard", "kind", "status", "worker", "GPU", "attempts", "seconds")
        for sh in j["shards"]:
            table.add_row(str(sh["phase"]), str(sh["index"]), sh["kind"], sh["status"], sh["worker"] or "-",
                          sh["gpu"] or "-", str(sh["attempts"]),
                          "-" if sh["seconds"] is None else f"{sh['seconds']:.2f}")
        out.print(table)
    for o in j["outputs"]:
        out.print(f"output {o['name']}: {o['bytes']} bytes, sha256 {o['sha256']}")
    if j.get("error"):
        out.print(f"error: {j['error']}")


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None) -> None:
    """Cancel a queued or running job (a shard already computing finishes; its result is dropped)."""
    j = _api_call(api, token, data_dir, "POST", f"/v1/jobs/{job_id}/cancel")
    _stdout().print(f"job {j['id']}: {j['status']}")


@jobs_app.command("download")
def jobs_download(
    job_id: str,
    out: Annotated[Path, typer.Option("--out", help="Where to save outputs.")] = Path("."),
    timeout: Annotated[float, typer.Option(help="Seconds to wait for a job still running.")] = 3600,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """Wait for a job (progress bar) and download its outputs, verified against their sha256."""
    from cli.client import SubmitError, call, connect, download_outputs, wait_for_job

    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            job = wait_for_job(client, call(client, "GET", f"/v1/jobs/{job_id}"), timeout, console)
            paths = download_outputs(client, job, out, console)
    except SubmitError as exc:
        raise _fail(str(exc)) from exc
    for p in paths:
        print(p)


PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command("quality", context_settings=PASS_THROUGH)
def quality(ctx: typer.Context) -> None:
    """Image-quality benchmark vs LibRaw on held-out synthetic shots (--help for options; docs/QUALITY.md)."""
    from lab.quality.cli import main as quality_main

    raise typer.Exit(quality_main(ctx.args) or 0)


# kind -> (module with a ``main(argv)``, what it measures)
BENCH_KINDS: dict[str, tuple[str, str]] = {
    "pipeline": ("lab.bench.pipeline", "in-process pipeline speed: decode, strips on the GPUs, stacks, TIFF"),
    "enhance": ("lab.bench.enhance", "enhance-stage speed per package and precision; strip exactness on the device"),
    "stack": ("lab.quality.stack_bench", "stack quality: merged stack vs single frame vs truth (PSNR, CIEDE2000)"),
    "service": ("lab.bench.service", "shots through a running `strata serve` (REST, queue, workers, storage)"),
    "preview": ("lab.bench.preview", "the fast preview at ingest: binned mosaic -> sRGB JPEG (CPU), per step"),
}


@app.command("bench", context_settings=PASS_THROUGH)
def bench(ctx: typer.Context) -> None:
    """Benchmarks: `strata bench pipeline|enhance|stack|service [options]` (docs/PERFORMANCE.md)."""
    import importlib

    usage = f"usage: strata bench {{{'|'.join(BENCH_KINDS)}}} [options]; --help after the kind for options"
    if ctx.args and ctx.args[0] in ("-h", "--help"):
        print(usage + "\n\nkinds:\n" + "\n".join(f"  {k:<9} {text} ({module})"
                                                 for k, (module, text) in BENCH_KINDS.items()))
        raise typer.Exit(0)
    if not ctx.args or ctx.args[0] not in BENCH_KINDS:
        from rich.markup import escape

        raise _fail(escape(usage), 2)
    module = importlib.import_module(BENCH_KINDS[ctx.args[0]][0])
    raise typer.Exit(module.main(ctx.args[1:]) or 0)


def main() -> None:  # pragma: no cover
    logging.basicConfig(level=get_settings().log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
