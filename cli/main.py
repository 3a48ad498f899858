"""The `strata` command line: serve, workers, coordinator, submit, jobs, synth, token, db, bench, quality."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
import uuid
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from cli.storage import storage_app
from services.config import get_settings, settings_or_exit, unknown_variables
from services.local_service import local_service, remember_local_service

if TYPE_CHECKING:
    import httpx

    from workers.launcher import Supervisor

app = typer.Typer(help="Strata: asynchronous RAW render service. Exit codes: 0 ok, 1 a job failed, 2 bad usage, "
                  "3 service unreachable, 4 token refused.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
token_app = typer.Typer(help="Station and admin tokens.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
jobs_app = typer.Typer(help="This station's jobs: list, show, cancel, download, remove-files.", no_args_is_help=True)
batch_app = typer.Typer(help="Overnight batches: create, status, report, download, list, cancel.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")
app.add_typer(batch_app, name="batch")
app.add_typer(storage_app, name="storage")
console = Console(stderr=True)

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data directory (default ./var or STRATA_DATA_DIR).")]


def _writable_out(out: Path | None) -> None:
    """``--out`` is (or can be made) a folder this user can write, checked before anything is sent: exit 2 with
    the reason, not a traceback once the renders are done."""
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".strata-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise _fail(f"--out {out} cannot be used: {exc.strerror or exc}", 2) from None


def _private(data: Path) -> Path:
    """What `strata serve` writes (the database with its webhook secrets, every station's RAWs and TIFFs) is its
    user's alone: files 0600 and folders 0700 from now on, the data folder itself 0700 (found from outside: all of
    it was readable by every local user)."""
    os.umask(0o077)
    with contextlib.suppress(OSError):
        data.chmod(0o700)
    return data


def _use_data_dir(data_dir: Path | None, create: bool = True) -> Path:
    """Point the settings (and every child process) at ``data_dir``."""
    if data_dir is not None:
        os.environ["STRATA_DATA_DIR"] = str(data_dir.resolve())
        get_settings.cache_clear()
    settings = get_settings()
    if create:
        try:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            probe = settings.data_dir / f".strata-write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise _fail(f"data dir {settings.data_dir} cannot be used: {exc.strerror or exc} (pass --data-dir or set "
                        "STRATA_DATA_DIR)", 2) from None
    return settings.data_dir


def _upgrade(stop: Supervisor | None = None) -> None:
    """Bring the configured database to the latest schema; one that cannot be reached or read stops the command
    with exit 2 and the database's error in one line (its password hidden), not a traceback (``stop``: the
    supervisor of what was started already, stopped first)."""
    from alembic.util.exc import CommandError
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from services.db.migrate import upgrade

    try:
        upgrade()
    except (SQLAlchemyError, CommandError) as exc:  # CommandError: a revision this release does not know (newer)
        url = get_settings().resolved_database_url
        try:
            shown = make_url(url).render_as_string(hide_password=True)
        except ArgumentError:
            shown = url.rpartition("@")[2]
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        if isinstance(exc, CommandError):
            reason += " (a newer Strata migrated it? run that release, or restore a backup)"
        if stop is not None:
            stop.stop()
        raise _fail(f"the database {shown} cannot be used: {reason} (STRATA_DATABASE_URL)", 2) from None


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@db_app.command("upgrade")
def db_upgrade(data_dir: DataDir = None) -> None:
    """Create or upgrade the database schema (Alembic)."""
    _use_data_dir(data_dir)

    _upgrade()
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
        raise _fail("give --station NAME (or --admin --name NAME)", 2)
    _use_data_dir(data_dir)
    from services.db.session import session_scope
    from services.errors import BadInput, StrataError
    from services.stations import create_station_token

    _upgrade()
    try:
        with session_scope() as session:
            token = create_station_token(session, who, replace=rotate, role="admin" if admin else "station")
    except StrataError as exc:  # a name that cannot be one: bad usage (2); one that exists: 1
        raise _fail(exc.detail, 2 if isinstance(exc, BadInput) else 1) from exc
    console.print(f"{'admin' if admin else 'station'} {who!r}: keep this token, it is not shown again")
    print(token)


@token_app.command("list")
def token_list(data_dir: DataDir = None) -> None:
    """Every station and admin: name, role, created, revoked."""
    _use_data_dir(data_dir)
    from services.db.session import session_scope
    from services.stations import list_tokens

    _upgrade()
    with session_scope() as session:
        tokens = list_tokens(session)
    for t in tokens:  # tab-separated: name, role, created, live|revoked
        print(f"{t.name}\t{t.role}\t{t.created_at}\t{'revoked' if t.revoked else 'live'}")


@token_app.command("revoke")
def token_revoke(name: str, data_dir: DataDir = None) -> None:
    """Revoke NAME's token: refused from now on (its jobs stay)."""
    _use_data_dir(data_dir)
    from services.db.session import session_scope
    from services.errors import StrataError
    from services.stations import revoke_token

    _upgrade()
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


def _wait_ready(url: str, instance: str, tries: int = 120) -> tuple[bool, str]:
    """Poll ``/readyz`` every 0.5 s: (ready, what was not ok at the last answer: database, Redis, storage);
    ``OTHER_SERVICE`` when the API answering is not this serve's (``instance``: another took the port first)."""
    import httpx

    why = ""
    for _ in range(tries):
        try:
            answer = httpx.get(f"{url}/readyz", timeout=2)
            if answer.headers.get("x-strata-instance", instance) != instance:
                return False, OTHER_SERVICE
            if answer.status_code == 200:
                return True, ""
            body = answer.json()
            why = "; ".join(f"{k}: {body[k]}" for k in ("database", "redis", "storage")
                            if str(body.get(k, "ok")) != "ok")
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    return False, why


OTHER_SERVICE = "another service answers on this port"


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="API bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    data_dir: DataDir = None,
    workers: Annotated[bool, typer.Option(help="Also start the coordinator and GPU workers.")] = True,
) -> None:
    """Run everything on this machine: API, coordinator, one worker per GPU, and Redis if none is configured."""
    from workers.launcher import ProcSpec, Supervisor, free_port, hang_watch, lease_releaser, redis_spec, worker_specs

    _check_port(host, port)  # before anything starts: else the API child fails alone, /readyz asks the other program
    data = _private(_use_data_dir(data_dir).resolve())
    lock = _lock_data_dir(data, port)  # held while this serve runs: a second one would share its Redis files
    os.environ["STRATA_DATA_DIR"] = str(data)
    settings = get_settings()
    specs: list[ProcSpec] = []
    sup = Supervisor([], log_dir=data / "logs")  # one supervisor restarts every child, the private Redis too
    if not settings.redis_url:
        rport = free_port()
        sup.add([redis_spec(data, rport)])
        os.environ["STRATA_REDIS_URL"] = f"redis://127.0.0.1:{rport}/0"
        get_settings.cache_clear()
        settings = get_settings()
        _wait_redis(settings.redis_url or "", 15)
        console.print(f"started a private Redis on 127.0.0.1:{rport} (data in {data / 'redis'}, AOF on)")
    sup.on_exit = lease_releaser(settings)  # a dead worker's work is re-dispatched at once, not when its beat ends
    sup.hang_check = hang_watch(settings)  # a worker alive but silent (SIGSTOPped, stuck) is killed and restarted
    _upgrade(stop=sup)
    token_path = ensure_local_token()
    instance = uuid.uuid4().hex  # /readyz names it: the API answering is this serve's, not one that took the port
    specs.append(ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory",
                                  "--host", host, "--port", str(port), "--log-level", "warning"],
                          {"STRATA_MIGRATE_ON_START": "false", "STRATA_SERVE_INSTANCE": instance}))
    if workers:
        specs += worker_specs(settings)
    from services.metrics import reset_multiproc_dir

    reset_multiproc_dir()  # counters of an earlier run's processes
    sup.add(specs)
    url = f"http://{host}:{port}"
    local_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    console.print(f"Strata API on {url} (docs at {url}/docs); logs in {data / 'logs'}")
    console.print(f"local station token: {token_path}")
    ready, why = _wait_ready(url, instance)
    if why == OTHER_SERVICE:  # two serves started at once on one port: this one's API could not bind it
        sup.stop()
        raise _fail(f"cannot serve on {host}:{port}: {why} (a Strata service started just before this one)", 2)
    remember_local_service(local_url, token_path, data, last=settings.remember_last_service)
    console.print("[green]ready[/green]" if ready else
                  f"[yellow]not ready yet{': ' + escape(why) if why else ''}; see /readyz and the logs[/yellow]")
    try:
        sup.run_forever()
    finally:
        lock.close()
        console.print("stopped")


def _lock_data_dir(data: Path, port: int) -> IO[str]:
    """Take ``DATA/serve.lock`` (an exclusive ``flock``, released when this process ends however it ends) and write
    this serve's pid and port in it; exit 2 naming the other serve where one holds it already: two would start two
    private Redis servers on the same AOF files and two sets of workers on one database."""
    import fcntl

    f = open(data / "serve.lock", "a+")  # noqa: SIM115 - held open for the life of this serve
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().split()
        f.close()
        who = f"pid {holder[0]}, API port {holder[1]}" if len(holder) >= 2 else "another process"
        raise _fail(f"another strata serve ({who}) is using the data dir {data}; stop it first or pass another "
                    "--data-dir", 2) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()} {port}\n")
    f.flush()
    return f


def _check_port(host: str, port: int) -> None:
    """Exit 2 where the API could not listen on ``host:port``."""
    problem = _port_problem(host, port)
    if problem:
        raise _fail(f"cannot serve on {host}:{port}: {problem} (another program holds it? pass --port)", 2)


def _port_problem(host: str, port: int) -> str | None:
    """Why the API could not listen on ``host:port`` (bound here the way uvicorn binds it), or None."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"unknown address ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


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
    from workers.launcher import Supervisor, hang_watch, lease_releaser, worker_specs

    _use_data_dir(data_dir)
    settings = get_settings()
    ids = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
    specs = worker_specs(settings, gpus=ids, coordinator=coordinator, gpu_workers=gpu_workers)
    pinned = [s.env["STRATA_WORKER_GPU"] for s in specs if s.env.get("STRATA_WORKER_GPU", "cpu") != "cpu"]
    if pinned:  # found from outside: `--gpus 0` on a host without one computed on the CPU, unseen
        from workers.launcher import visible_gpus

        seen = visible_gpus()
        if seen == 0 or any(g.isdigit() and int(g) >= seen for g in pinned):
            raise _fail(f"GPU(s) {', '.join(dict.fromkeys(pinned))} asked for (--gpus / STRATA_GPU_ID) but CUDA sees "
                        f"{seen} on this host: no GPU, no driver, or a torch built without CUDA; leave --gpus out to "
                        f"run CPU workers", 2)
    for s in specs:
        console.print(f"{s.name}: CUDA_VISIBLE_DEVICES={s.env.get('CUDA_VISIBLE_DEVICES', '-')}")
    if settings.metrics_port:
        from services.metrics import serve_folder

        serve_folder(settings.metrics_port)
        console.print(f"metrics of this host's workers on :{settings.metrics_port}/metrics")
    Supervisor(specs, on_exit=lease_releaser(settings), hang_check=hang_watch(settings)).run_forever()


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


class Camera(StrEnum):
    IQ3_S = "IQ3_S"
    IQ2_XS = "IQ2_XS"


class Priority(StrEnum):
    interactive = "interactive"
    batch = "batch"


CameraOpt = Annotated[Camera | None, typer.Option(help="Camera (default: detect from the files).",
                                                  case_sensitive=False)]
PriorityOpt = Annotated[Priority | None, typer.Option(help="Queue lane (default: interactive).")]


def _split_recipes(values: list[str] | None) -> list[str] | None:
    """``--recipe tiff16,jpeg-proof`` is two recipes, as the API reads the field (it was checked as one name)."""
    return None if values is None else [r.strip() for v in values for r in v.split(",") if r.strip()]


RecipeOpt = Annotated[list[str] | None, typer.Option(
    "--recipe", callback=_split_recipes,
    help="Output recipe, repeatable or comma-separated (checked against GET /v1/recipes; default: the service's).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's JSON on stdout instead of a table.")]
CursorOpt = Annotated[str | None, typer.Option(help="Go on after an earlier list: the cursor its end named.")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"strata {version('strata')}")
        except PackageNotFoundError:
            print("strata (not installed)")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    retry_for: Annotated[float, typer.Option("--retry-for", envvar="STRATA_RETRY_FOR", min=0,
                                             help="Seconds to keep retrying an API that does not answer.")] = 30.0,
) -> None:
    """Strata: asynchronous RAW render service."""
    import cli.client

    cli.client.RETRY_FOR_S = retry_for


def _exit_for(exc: Exception) -> typer.Exit:
    """A clean exit with the error's code (1 failed, 2 usage, 3 unreachable, 4 token refused)."""

    return _fail(escape(str(exc)), getattr(exc, "exit_code", 1))


def _shots_or_exit(inputs: list[Path], stack: bool, stacks_by_name: bool) -> list[Any]:
    from cli.discovery import MAX_STACK, MIN_STACK, plan_shots

    if stack and stacks_by_name:
        raise _fail("--stack and --stacks-by-name exclude each other", 2)
    shots = plan_shots(inputs, stack=stack, stacks_by_name=stacks_by_name)
    if not shots:
        raise _fail(f"no RAW files in {', '.join(map(str, inputs))}", 2)
    if stack and not MIN_STACK <= len(shots[0].files) <= MAX_STACK:  # one file went out as a single shot
        raise _fail(f"--stack: a stack has {MIN_STACK}-{MAX_STACK} frames, not {len(shots[0].files)}", 2)
    return shots


def _print_results(results: list[Any], as_json: bool) -> None:
    import json

    if as_json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return
    for r in results:
        for p in r.paths:
            print(p)
        if not r.paths:
            job = r.job or {}
            print(f"{r.shot.name}\t{job.get('id', '-')}\t{r.status}\t{r.error or job.get('error') or ''}")


InputsArg = Annotated[list[Path], typer.Argument(help="RAW files and/or folders (searched recursively).",
                                                 exists=True)]
StackOpt = Annotated[bool, typer.Option("--stack", help="All the given files are the frames of one stack.")]
ByNameOpt = Annotated[bool, typer.Option("--stacks-by-name", help="Group <base>_<NN>.<ext> / <base>-<NN>.<ext> "
                                         "files of one folder with 2-16 consecutive numbers into stacks.")]


@app.command()
def submit(
    inputs: InputsArg,
    camera: CameraOpt = None,
    recipe: RecipeOpt = None,
    priority: PriorityOpt = None,
    stack: StackOpt = False,
    stacks_by_name: ByNameOpt = False,
    wait: Annotated[bool, typer.Option(help="Wait for the jobs and download their outputs.")] = True,
    out: Annotated[Path, typer.Option("--out", help="Where to save outputs (mirroring the folders given).")]
    = Path("."),
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array on stdout, an object per shot.")] = False,
    api: Annotated[str | None, typer.Option(help="API URL (default STRATA_API_URL or local).")] = None,
    token: Annotated[str | None, typer.Option(help="Station token (default STRATA_TOKEN or local).")] = None,
    data_dir: DataDir = None,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait for the jobs.")] = 3600,
) -> None:
    """Upload shots from files and folders (stacks: --stack, --stacks-by-name), wait, download the outputs."""
    from cli.client import SubmitError, connect
    from cli.station import ShotResult, check_recipes, download_results, exit_code, upload_shots, wait_for_shots

    results = [ShotResult(s) for s in _shots_or_exit(inputs, stack, stacks_by_name)]
    if wait:
        _writable_out(out)
    url, tok = _api_token(api, token, data_dir)
    fields = {"camera": camera.value if camera else None, "recipes": recipe or [],
              "priority": priority.value if priority else None}
    try:
        with connect(url, tok) as client:
            check_recipes(client, recipe or [], console)
            upload_shots(client, results, fields, console)
            if wait:
                wait_for_shots(client, results, timeout, console)
                download_results(client, results, out, console)
    except SubmitError as exc:
        if any(r.job for r in results):  # what was sent before the service went away, for scripts
            _print_results(results, as_json)
        raise _exit_for(exc) from exc
    _print_results(results, as_json)
    raise typer.Exit(exit_code(results))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _check_recipes_if_up(client: Any, recipes: list[str], once: bool) -> None:
    """The recipe check; a hot folder that runs on does not wait for an API that is down to do it."""
    from cli.client import Unreachable
    from cli.station import check_recipes

    try:
        check_recipes(client, recipes, console, None if once else 0)
    except Unreachable as exc:
        if once:
            raise
        console.print(f"[yellow]{exc}: recipes not checked; files stay pending until it answers[/yellow]")


def _single_frame_camera(camera: Camera | None) -> None:
    """The watcher sends each file alone: a camera whose shots are stacks (IQ2_XS) would have every file refused,
    so it is refused up front (exit 2)."""
    from services.jobs.cameras import PROFILES

    if camera is not None and PROFILES[camera.value].min_frames > 1:
        profile = PROFILES[camera.value]
        raise _fail(f"--camera {camera.value} takes stacks of {profile.min_frames}-{profile.max_frames} frames; "
                    "the watcher sends each file as one shot: leave --camera out, or send stacks with "
                    "`strata submit --stack` / `--stacks-by-name`", 2)


@app.command()
def watch(
    folder: Annotated[Path, typer.Argument(help="The hot folder (searched recursively).", exists=True,
                                           file_okay=False)],
    out: Annotated[Path | None, typer.Option("--out", help="Where to save outputs (default: beside each file).")]
    = None,
    camera: CameraOpt = None,
    recipe: RecipeOpt = None,
    priority: PriorityOpt = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 2.0,
    settle: Annotated[float, typer.Option(min=0, help="A file is complete once its size and mtime stayed the "
                                                      "same for this many seconds.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="One pass: send what is complete, wait for those jobs, "
                                                      "save their outputs, exit.")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="--once: seconds to wait for the jobs.")] = 3600,
    api: Annotated[str | None, typer.Option(help="API URL (default STRATA_API_URL or local).")] = None,
    token: Annotated[str | None, typer.Option(help="Station token (default STRATA_TOKEN or local).")] = None,
    data_dir: DataDir = None,
) -> None:
    """Hot folder: send each new RAW file once completely written, save its outputs beside it or to --out."""
    import signal
    import threading

    import cli.client
    from cli.client import SubmitError, connect
    from cli.watch import Watcher, watch_forever, watch_once

    _writable_out(out)
    _single_frame_camera(camera)
    stopping = threading.Event()
    # --once ends at once on SIGTERM; the hot folder finishes the step under way (a download, its state) first.
    signal.signal(signal.SIGTERM, _interrupt if once else lambda signum, frame: stopping.set())

    url, tok = _api_token(api, token, data_dir)
    fields = {"camera": camera.value if camera else None, "recipes": recipe or [],
              "priority": priority.value if priority else None}
    try:
        with connect(url, tok) as client:
            watcher = Watcher(folder, client, console, fields=fields, out=out, settle=settle)
            _check_recipes_if_up(client, recipe or [], once)
            console.print(f"watching {folder} every {interval:g} s (settle {settle:g} s); state in "
                          f"{watcher.state.path}")
            if once:
                raise typer.Exit(watch_once(watcher, timeout=timeout, retry_for=cli.client.RETRY_FOR_S))
            watch_forever(watcher, interval, stopping)
            console.print("stopped; state saved")
    except SubmitError as exc:
        raise _exit_for(exc) from exc
    except KeyboardInterrupt:
        console.print("stopped; state saved")


def _api_token(api: str | None, token: str | None, data_dir: Path | None) -> tuple[str, str]:
    """The API URL and station token: the options, else STRATA_API_URL / STRATA_TOKEN, else the record of the
    `strata serve` of the data directory (--data-dir, STRATA_DATA_DIR or ./var), else of the last one started."""
    _use_data_dir(data_dir, create=False)
    settings = get_settings()
    given = data_dir is not None or bool(os.environ.get("STRATA_DATA_DIR"))
    local = local_service(settings.data_dir if given else None)
    tok = token or settings.token
    if not tok and settings.token_file.exists():
        tok = settings.token_file.read_text().strip()
    if not tok and local.get("token_file") and Path(local["token_file"]).exists():
        tok = Path(local["token_file"]).read_text().strip()
    if not tok:
        raise _fail(f"no token: pass --token, set STRATA_TOKEN, or run `strata serve` (it writes "
                    f"{settings.token_file})")
    return api or (settings.api_url if "api_url" in settings.model_fields_set else None) or local.get(
        "api_url") or settings.api_url, tok


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
    from cli.client import SubmitError, call, connect, with_retry

    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            return with_retry(lambda: call(client, method, path, **kwargs), console)
    except SubmitError as exc:
        raise _exit_for(exc) from exc


def _print_json(body: Any) -> None:
    import json

    print(json.dumps(body, indent=2))


JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")


@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="queued, running, done, failed or cancelled (several: "
                                                    "comma-separated).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="How many, newest first.")] = 20,
    cursor: CursorOpt = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """This station's jobs, newest first (older ones: --cursor, as the end of the list says)."""
    from rich.table import Table

    unknown = [s for s in (status or "").split(",") if s.strip() and s.strip() not in JOB_STATUSES]
    if unknown:  # the API's 422 exited 1, as if a job had failed
        raise _fail(f"--status: unknown status {', '.join(unknown)}; choose from {', '.join(JOB_STATUSES)}", 2)
    params: dict[str, str | int] = {"limit": limit} | ({"status": status} if status else {})
    body = _api_call(api, token, data_dir, "GET", "/v1/jobs", params=params | ({"cursor": cursor} if cursor else {}))
    if as_json:
        return _print_json(body)
    jobs = body["jobs"]
    table = Table("job", "status", "stage", "progress", "camera", "frames", "created (UTC)", "time", "output")
    for j in jobs:
        table.add_row(j["id"], j["status"], j["stage"], f"{j['progress']:.0%}", j["camera"], str(len(j["frames"])),
                      j["created_at"][:19].replace("T", " "), _duration(j),
                      ", ".join(o["name"] for o in j["outputs"]) or (j.get("error") or "")[:40])
    _stdout().print(table)
    _more(body, f"jobs list --limit {limit}" + (f" --status {status}" if status else ""))


def _more(body: dict, command: str) -> None:
    """Where a list goes on (on stderr: stdout keeps the table alone): a studio's thousands of jobs and hundreds
    of batches are more than one page (found from outside: only the newest page could be listed)."""
    if body.get("next_cursor"):
        console.print(f"more: strata {command} --cursor {body['next_cursor']}", soft_wrap=True)


@jobs_app.command("show")
def jobs_show(job_id: str, as_json: JsonOpt = False, api: ApiOpt = None, token: TokenOpt = None,
              data_dir: DataDir = None) -> None:
    """One job: status, frames, shards (worker, GPU, seconds), outputs, error."""
    from rich.table import Table

    j = _api_call(api, token, data_dir, "GET", f"/v1/jobs/{job_id}")
    if as_json:
        return _print_json(j)
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


@jobs_app.command("remove-files")
def jobs_remove_files(job_id: str, api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None) -> None:
    """Remove an ended job's uploads and outputs now (after you have copied them off); its record stays."""
    j = _api_call(api, token, data_dir, "DELETE", f"/v1/jobs/{job_id}/files")
    _stdout().print(f"job {j['id']}: files removed at {j['files_removed_at']}")


@jobs_app.command("download")
def jobs_download(
    job_id: str,
    out: Annotated[Path, typer.Option("--out", help="Where to save outputs.")] = Path("."),
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait for a job still running.")] = 3600,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """Wait for a job (progress bar) and download its outputs, verified against their sha256."""
    from cli.client import SubmitError, call, connect, download_outputs, wait_for_job

    _writable_out(out)
    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            job = wait_for_job(client, call(client, "GET", f"/v1/jobs/{job_id}"), timeout, console)
            paths = download_outputs(client, job, out, console)
    except SubmitError as exc:
        raise _exit_for(exc) from exc
    for p in paths:
        print(p)


def _when(value: str | None, option: str) -> str | None:
    """An ISO 8601 time given to --not-before / --not-after, checked here so a typo is a usage error."""
    import datetime as dt

    if value is None:
        return None
    try:
        dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise _fail(f"{option}: not an ISO 8601 time: {value!r} (e.g. 2026-12-01T22:00 or 2026-12-01T22:00+01:00)",
                    2) from exc
    return value


def _batch_body(name: str, recipe: list[str] | None, priority: Priority | None, not_before: str | None,
                not_after: str | None, webhook: str | None, paths: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "recipes": recipe or [], "paths": paths or [],
                            "priority": priority.value if priority else None,
                            "not_before": _when(not_before, "--not-before"),
                            "not_after": _when(not_after, "--not-after"), "webhook_url": webhook}
    if webhook and not webhook.startswith(("http://", "https://")):
        raise _fail(f"--webhook must be an http(s) URL, not {webhook!r}", 2)
    return {k: v for k, v in body.items() if v not in (None, [])}


@batch_app.command("create")
def batch_create(
    name: Annotated[str, typer.Argument(help="The batch's name.")],
    inputs: Annotated[list[Path] | None, typer.Argument(help="RAW files and/or folders to upload into it.",
                                                        exists=True)] = None,
    recipe: RecipeOpt = None,
    priority: Annotated[Priority | None, typer.Option(help="Queue lane of its shots (default: batch).")] = None,
    not_before: Annotated[str | None, typer.Option(help="Start no job before this time (ISO 8601).")] = None,
    not_after: Annotated[str | None, typer.Option(help="Start no job after this time (ISO 8601).")] = None,
    webhook: Annotated[str | None, typer.Option(help="http(s) URL notified when the batch ends.")] = None,
    path: Annotated[list[str] | None, typer.Option("--path", help="A server-side path under the import root, "
                                                   "repeatable.")] = None,
    camera: CameraOpt = None, stack: StackOpt = False, stacks_by_name: ByNameOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help='{"batch": …, "shots": [… as submit --json …]} on stdout.')]
    = False,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """Create a batch (POST /v1/batches), then upload its shots into it one at a time."""
    from cli.client import SubmitError, call, connect, with_retry
    from cli.station import ShotResult, check_recipes, exit_code, upload_shots

    shots = _shots_or_exit(inputs, stack, stacks_by_name) if inputs else []
    results = [ShotResult(s) for s in shots]
    if not shots and not path:
        raise _fail("a batch needs shots: give files or folders, or --path", 2)
    body = _batch_body(name, recipe, priority, not_before, not_after, webhook, path)
    if shots:  # open while this command uploads: a batch whose first shots render before the next arrives
        body["sealed"] = False  # would otherwise end half-way and refuse the rest (409)
    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            check_recipes(client, recipe or [], console)
            key = {"Idempotency-Key": f"strata-cli-{uuid.uuid4().hex}"}  # a retry gets the batch, not a second
            try:
                batch = with_retry(lambda: call(client, "POST", "/v1/batches", json=body, headers=key), console)
            except SubmitError as exc:
                if str(exc).startswith("422 "):  # the window, a path, a recipe: the command line's to fix
                    exc.exit_code = 2
                raise
            console.print(f"batch {batch['id']} created ({batch.get('status')})")
            fields = {"camera": camera.value if camera else None, "recipes": recipe or [],
                      "priority": priority.value if priority else None}
            try:
                upload_shots(client, results, fields, console, endpoint=f"/v1/batches/{batch['id']}/shots")
            finally:  # also after a failed or interrupted upload: the batch ends with the shots it got
                if shots and "sealed" in batch:  # a release before sealing says nothing of it and ends the batch itself
                    batch = _seal(client, batch)
                    if batch.get("sealed") and batch.get("total") == 0 and batch.get("status") != "cancelled":
                        batch = _cancel_empty(client, batch)  # none got there (a service that does not cancel it)
            if not shots:
                with contextlib.suppress(SubmitError):  # as it is now, its imported shots counted
                    batch = call(client, "GET", f"/v1/batches/{batch['id']}")
    except SubmitError as exc:
        raise _exit_for(exc) from exc
    if as_json:
        _print_json({"batch": batch, "shots": [r.to_json() for r in results]})
    else:
        _stdout().print(f"batch {batch['id']}: {sum(r.job is not None for r in results)} of {len(results)} "
                        f"shot(s) uploaded")
    raise typer.Exit(exit_code(results))


def _seal(client: httpx.Client, batch: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/batches/{id}/seal (retried); the batch as it is then, or as it was where the seal failed."""
    from cli.client import SubmitError, call, with_retry

    try:
        return dict(with_retry(lambda: call(client, "POST", f"/v1/batches/{batch['id']}/seal"), console))
    except SubmitError as exc:
        console.print(f"[yellow]could not seal batch {batch['id']} ({exc}): it will not end before "
                      f"`strata batch seal {batch['id']}`[/]")
        return batch


def _cancel_empty(client: httpx.Client, batch: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/batches/{id}/cancel (retried) for a batch none of whose shots was uploaded; the batch as it is
    then, or as it was where the cancel failed."""
    from cli.client import SubmitError, call, with_retry

    try:
        batch = dict(with_retry(lambda: call(client, "POST", f"/v1/batches/{batch['id']}/cancel"), console))
    except SubmitError as exc:
        console.print(f"[yellow]no shot was uploaded and batch {batch['id']} could not be cancelled ({exc}): "
                      f"`strata batch cancel {batch['id']}`[/]")
        return batch
    console.print(f"[yellow]no shot was uploaded: batch {batch['id']} cancelled[/]")
    return batch


@batch_app.command("seal")
def batch_seal(batch_id: str, as_json: JsonOpt = False, api: ApiOpt = None, token: TokenOpt = None,
               data_dir: DataDir = None) -> None:
    """No more shots are coming (POST /v1/batches/{id}/seal): the batch ends once its shots are over."""
    from cli.client import SubmitError, call, connect

    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            batch = call(client, "POST", f"/v1/batches/{batch_id}/seal")
    except SubmitError as exc:
        raise _exit_for(exc) from exc
    if as_json:
        _print_json(batch)
    else:
        _stdout().print(f"batch {batch['id']} sealed ({batch['status']})")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "-"


@batch_app.command("status")
def batch_status(batch_id: str, as_json: JsonOpt = False, api: ApiOpt = None, token: TokenOpt = None,
                 data_dir: DataDir = None) -> None:
    """One batch: status, counts of its jobs by status, ETA."""
    b = _api_call(api, token, data_dir, "GET", f"/v1/batches/{batch_id}")
    if as_json:
        return _print_json(b)
    out = _stdout()
    out.print(f"batch {b['id']} {b.get('name', '')!r}: {b['status']}; {_counts(b.get('counts') or {})}; "
              f"eta {b.get('eta') or '-'}")
    for key in ("priority", "recipes", "not_before", "not_after"):
        if b.get(key):
            out.print(f"{key}: {b[key]}")


@batch_app.command("list")
def batch_list(limit: Annotated[int, typer.Option(min=1, max=200, help="How many, newest first.")] = 50,
               cursor: CursorOpt = None, as_json: JsonOpt = False, api: ApiOpt = None, token: TokenOpt = None,
               data_dir: DataDir = None) -> None:
    """This station's batches, newest first (older ones: --cursor, as the end of the list says)."""
    from rich.table import Table

    params: dict[str, str | int] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
    body = _api_call(api, token, data_dir, "GET", "/v1/batches", params=params)
    if as_json:
        return _print_json(body)
    table = Table("batch", "name", "status", "jobs", "eta", "created (UTC)")
    for b in body.get("batches", []):
        table.add_row(b["id"], b.get("name", ""), b["status"], _counts(b.get("counts") or {}), str(b.get("eta") or "-"),
                      str(b.get("created_at") or "")[:19].replace("T", " "))
    _stdout().print(table)
    _more(body, f"batch list --limit {limit}")


class ReportFormat(StrEnum):
    json = "json"
    csv = "csv"


@batch_app.command("report")
def batch_report(
    batch_id: str,
    fmt: Annotated[ReportFormat, typer.Option("--format", help="json or csv.")] = ReportFormat.json,
    out: Annotated[Path | None, typer.Option("--out", help="Write the report to this file (default stdout).")]
    = None,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """Per-shot report of a batch (status, timings, outputs with sha256, error), as the API gives it."""
    import json

    from cli.client import SubmitError, connect, request, with_retry

    url, tok = _api_token(api, token, data_dir)
    params = {"format": "csv"} if fmt is ReportFormat.csv else {}
    try:
        with connect(url, tok) as client:
            resp = with_retry(lambda: request(client, "GET", f"/v1/batches/{batch_id}/report", params=params),
                              console)
    except SubmitError as exc:
        raise _exit_for(exc) from exc
    data = resp.content if fmt is ReportFormat.csv else (json.dumps(resp.json(), indent=2) + "\n").encode()
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        out.write_bytes(data)
        console.print(f"report written to {out}")


@batch_app.command("download")
def batch_download(
    batch_id: str,
    out: Annotated[Path, typer.Option("--out", help="Where to save outputs (default: the current folder).")]
    = Path("."),
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the batch to end first.")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds --wait waits for the batch to end.")] = 86400,
    api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None,
) -> None:
    """Download the outputs of a batch's rendered shots into --out, verified against their sha256 (a file
    already there with the same bytes is kept: run it again to fetch what finished since). Prints the saved paths;
    exit 1 when a shot failed, was cancelled or is not done yet (each is named on stderr)."""

    from cli.client import SubmitError, call, connect
    from cli.station import download_batch, wait_for_batch

    _writable_out(out)
    url, tok = _api_token(api, token, data_dir)
    try:
        with connect(url, tok) as client:
            if wait:
                wait_for_batch(client, batch_id, timeout, console)
            report = call(client, "GET", f"/v1/batches/{batch_id}/report")
            saved, problems = download_batch(client, report.get("shots", []), out, console)
    except SubmitError as exc:
        raise _exit_for(exc) from exc
    for p in saved:
        print(p)
    for line in problems:
        console.print(f"[yellow]{escape(line)}[/yellow]")
    console.print(f"batch {batch_id}: {len(saved)} file(s) saved in {out}; {len(problems)} shot(s) not saved")
    if problems:
        raise typer.Exit(1)


@batch_app.command("cancel")
def batch_cancel(batch_id: str, api: ApiOpt = None, token: TokenOpt = None, data_dir: DataDir = None) -> None:
    """Cancel a batch: its jobs not yet ended are cancelled."""
    b = _api_call(api, token, data_dir, "POST", f"/v1/batches/{batch_id}/cancel")
    _stdout().print(f"batch {b['id']}: {b['status']}")


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
    "shifts": ("lab.bench.shifts", "the pixel-shift check of a 4-frame stack's ingest (global shifts, CPU)"),
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

        raise _fail(escape(usage), 2)
    module = importlib.import_module(BENCH_KINDS[ctx.args[0]][0])
    raise typer.Exit(module.main(ctx.args[1:]) or 0)


@app.command("chaos", context_settings=PASS_THROUGH)
def chaos(ctx: typer.Context) -> None:
    """Chaos drill: jobs through a real `strata serve` under random SIGKILLs (--help for options; lab/chaos.py)."""
    from lab.chaos import main as chaos_main

    raise typer.Exit(chaos_main(ctx.args) or 0)


def main() -> None:  # pragma: no cover
    if isinstance(sys.stdout, io.TextIOWrapper):  # a path that is not UTF-8 printed as its bytes, not a traceback
        sys.stdout.reconfigure(errors="surrogateescape")
    level = settings_or_exit().log_level.upper()  # a bad STRATA_* variable: one line each, exit 2
    for line in unknown_variables():
        print(f"strata: warning: {line}", file=sys.stderr)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # seven "setup plugin" lines a command
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
