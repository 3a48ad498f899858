"""Capture-station client work shared by `strata submit`, `strata watch` and `strata batch create`: check the
recipes, upload shots with progress bars, wait for many jobs, download their outputs."""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from cli.client import (
    BadUsage,
    FileGone,
    SubmitError,
    Unreachable,
    _error,
    _ProgressReader,
    _sha256,
    call,
    download_outputs,
    still_there,
    unreachable,
    upload_name,
    with_retry,
)
from cli.discovery import Shot

ENDED = ("done", "failed", "cancelled")


@dataclass
class ShotResult:
    """What became of one shot: its job (as the API last answered), the files saved, an error; ``gone``: a file of
    it vanished before it was sent."""

    shot: Shot
    job: dict[str, Any] | None = None
    paths: list[Path] = field(default_factory=list)
    error: str | None = None
    gone: bool = False

    @property
    def status(self) -> str:
        if self.job is None:
            return "refused" if self.error and not self.gone else "not_sent"
        return "error" if self.error and self.job["status"] == "done" else str(self.job["status"])

    def to_json(self) -> dict[str, Any]:
        job = self.job or {}
        return {"files": [str(p) for p in self.shot.files], "job": job.get("id"), "status": self.status,
                "camera": job.get("camera"), "outputs": job.get("outputs", []), "paths": [str(p) for p in self.paths],
                "error": self.error or job.get("error")}


def offered_recipes(client: httpx.Client, console: Console, retry_for: float | None = None) -> list[str] | None:
    """The recipe names of ``GET /v1/recipes``, or None where the service has no such endpoint (404)."""
    try:
        body = with_retry(lambda: call(client, "GET", "/v1/recipes"), console, retry_for)
    except SubmitError as exc:
        if str(exc).startswith("404"):
            return None
        raise
    return [r["name"] for r in body.get("recipes", [])]


def check_recipes(client: httpx.Client, recipes: list[str], console: Console, retry_for: float | None = None
                  ) -> None:
    """Refuse (exit code 2) a recipe the service does not list; no check where it lists none. A name in another
    case (``TIFF16``) is listed where it names one recipe, as the API takes it (found from outside: refused)."""
    if not recipes:
        return
    offered = offered_recipes(client, console, retry_for)
    unknown = [r for r in recipes if offered is not None and r not in offered
               and sum(o.lower() == r.lower() for o in offered) != 1]
    if unknown:
        raise BadUsage(f"unknown recipe {', '.join(unknown)}: choose from {', '.join(offered or [])}")


def shot_fields(shot: Shot, *, camera: str | None, recipes: list[str], priority: str | None,
                sha256: list[str] | None = None) -> dict[str, Any]:
    """The multipart form fields of ``POST /v1/jobs`` for ``shot``; :class:`FileGone` if a file vanished."""
    with still_there():
        data: dict[str, Any] = {"sha256": sha256 or [_sha256(p) for p in shot.files]}
    if recipes:
        data["recipe"] = list(recipes)
    if priority:
        data["priority"] = priority
    if camera:
        data["camera"] = camera
    return data


def post_shot(client: httpx.Client, endpoint: str, shot: Shot, data: dict[str, Any], progress: Progress,
              overall: TaskID | None = None, key: str | None = None) -> dict[str, Any]:
    """Upload ``shot`` to ``endpoint`` (``/v1/jobs`` or a batch's ``/shots``) with a bar of its own that also
    advances ``overall``; the job. A try that will be retried (:class:`Unreachable`) takes its bytes back off the
    overall bar; a refused shot's bytes stay on it (they were sent, and the bar's speed stays positive).
    ``key``: the shot's Idempotency-Key, the same on every try, so a retry after a lost answer gets the job the
    first try created instead of rendering the shot twice. A file that vanished since it was found:
    :class:`FileGone`, nothing sent."""
    with still_there():
        total = sum(p.stat().st_size for p in shot.files)
    task = progress.add_task(f"upload {shot.name}"[:40], total=total)
    tasks = [task] if overall is None else [task, overall]
    try:
        readers = _open_readers(shot.files, progress, tasks)
    except FileGone:
        progress.remove_task(task)
        raise
    uploads = [("frames", (upload_name(p), r, "application/octet-stream"))
               for p, r in zip(shot.files, readers, strict=True)]
    try:
        resp = client.post(endpoint, data=data, files=uploads,  # type: ignore[arg-type]
                           headers={"Idempotency-Key": key} if key else None)
    except httpx.TransportError as exc:
        resp = None
        error: SubmitError = unreachable(client, exc)
    finally:
        for reader in readers:
            reader.close()
    if resp is not None and resp.status_code in (200, 201, 202):
        return dict(resp.json())
    if resp is not None:
        error = _error(resp)
    if overall is not None and isinstance(error, Unreachable):
        progress.advance(overall, -sum(r.sent for r in readers))
    progress.remove_task(task)
    raise error


def _open_readers(files: tuple[Path, ...], progress: Progress, tasks: list[TaskID]) -> list[_ProgressReader]:
    """A reader per file, all of them open or none (those opened already are closed): :class:`FileGone` if a file
    vanished."""
    readers: list[_ProgressReader] = []
    try:
        with still_there():
            for path in files:
                readers.append(_ProgressReader(path, progress, *tasks))
    except FileGone:
        for reader in readers:
            reader.close()
        raise
    return readers


def _size(path: Path) -> int:
    """The file's size for the overall bar; 0 for one that vanished (its shot is then reported, not sent)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def upload_shots(client: httpx.Client, results: list[ShotResult], fields: dict[str, Any], console: Console, *,
                 endpoint: str = "/v1/jobs", retry_for: float | None = None) -> None:
    """Upload every shot, one at a time, filling in ``results``: a bar per shot and one overall. A shot the API
    refuses (4xx), or one with a file that vanished since it was found, is recorded and the rest go on; an
    unreachable API is retried for ``retry_for``, then raises :class:`Unreachable` (``results`` then tell which
    were sent)."""
    total = sum(_size(p) for r in results for p in r.shot.files)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console) as progress:
        overall = progress.add_task(f"upload {len(results)} shot(s)", total=total)
        for result in results:
            try:
                data = shot_fields(result.shot, **fields)
                send = functools.partial(post_shot, client, endpoint, result.shot, data, progress, overall,
                                         f"strata-cli-{uuid.uuid4().hex}")  # one key per shot, kept across retries
                result.job = with_retry(send, console, retry_for)
            except FileGone as exc:
                result.error, result.gone = str(exc), True
                console.print(f"[red]{escape(result.shot.name)}: not sent: {escape(str(exc))}[/red]")
                continue
            except SubmitError as exc:
                if exc.exit_code != 1:  # unreachable, token refused: nothing else would get through either
                    raise
                result.error = str(exc)
                console.print(f"[red]{escape(result.shot.name)}: refused: {escape(str(exc))}[/red]")
                continue
            console.print(f"{result.shot.name}: job {result.job['id']} queued ({result.job['camera']}, "
                          f"{len(result.job['frames'])} frame(s))")


def _poll(client: httpx.Client, results: list[ShotResult], rendering: Progress, bars: dict[str, TaskID]
          ) -> Unreachable | None:
    """One round of ``GET /v1/jobs/{id}`` for the jobs still running; the outage, if the API did not answer."""
    for r in results:
        if r.job is None or r.job["status"] in ENDED:
            continue
        try:
            r.job = call(client, "GET", f"/v1/jobs/{r.job['id']}")
        except Unreachable as exc:
            return exc
        job = r.job
        rendering.update(bars[job["id"]], description=f"render {r.shot.name}: {job['stage']}"[:50],
                         completed=100 * job["progress"])
    return None


def wait_for_shots(client: httpx.Client, results: list[ShotResult], timeout: float, console: Console) -> None:
    """Poll every sent job until it ends (a bar each), riding out an API outage until ``timeout``; raises
    :class:`Unreachable` if the API is still down then, :class:`SubmitError` if a job is still running."""
    sent = [r for r in results if r.job is not None]
    deadline = time.monotonic() + timeout
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console) as rendering:
        bars = {r.job["id"]: rendering.add_task(f"render {r.shot.name}"[:50], total=100) for r in sent if r.job}
        while True:
            lost = _poll(client, sent, rendering, bars)
            if lost is None and all(r.job and r.job["status"] in ENDED for r in sent):
                return
            if time.monotonic() > deadline:
                running = [r.job["id"] for r in sent if r.job and r.job["status"] not in ENDED]
                raise lost or SubmitError(f"job(s) {', '.join(running)} still running after {timeout:g} s")
            if lost is not None:
                console.print(f"[yellow]{lost}; retrying[/yellow]")
            time.sleep(0.5 if lost is None else 2.0)


def download_results(client: httpx.Client, results: list[ShotResult], out: Path, console: Console) -> None:
    """Save each done job's outputs into ``out / shot.rel_dir``; a failed download is that shot's error. Two shots
    whose outputs would have one path (``shot.dng`` and ``shot.iiq`` in one folder) both keep theirs: the later
    one's gets ``_2``."""
    taken: set[str] = set()
    for r in results:
        if r.job is None or r.job["status"] != "done":
            continue
        try:
            r.paths = download_outputs(client, r.job, out / r.shot.rel_dir, console, taken)
        except SubmitError as exc:
            r.error = str(exc)
            console.print(f"[red]{r.shot.name}: {exc}[/red]")


def exit_code(results: list[ShotResult]) -> int:
    """0 when every shot is done and saved (or queued, without waiting), else 1."""
    ok = all(r.error is None and r.job is not None and r.job["status"] in ("done", "queued", "running")
             for r in results)
    return 0 if ok else 1




BATCH_ENDED = ("done", "failed", "cancelled")


def wait_for_batch(client: httpx.Client, batch_id: str, timeout: float, console: Console,
                   poll_s: float = 5.0) -> dict[str, Any]:
    """Poll the batch with a bar (shots ended of its total) until it ends; an API that stops answering is waited
    for until ``timeout``; :class:`SubmitError` if the batch has not ended by then."""
    deadline = time.monotonic() + timeout
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console) as waiting:
        bar = waiting.add_task(f"batch {batch_id[:8]}", total=None)
        while True:
            try:
                batch = call(client, "GET", f"/v1/batches/{batch_id}")
            except Unreachable as exc:
                if time.monotonic() > deadline:
                    raise
                waiting.update(bar, description=f"batch {batch_id[:8]}: waiting for the API ({exc})"[:70])
                time.sleep(min(poll_s, 2.0))
                continue
            counts = batch.get("counts") or {}
            ended = sum(counts.get(k, 0) for k in ("done", "failed", "cancelled", "not_run"))
            waiting.update(bar, total=batch.get("total") or None, completed=ended,
                           description=f"batch {batch_id[:8]}: {batch['status']}, eta {batch.get('eta') or '-'}"[:70])
            if batch["status"] in BATCH_ENDED:
                return batch
            if time.monotonic() > deadline:
                raise SubmitError(f"batch {batch_id} still {batch['status']} after {timeout:.0f} s")
            time.sleep(poll_s)


def shot_folder(name: str) -> Path:
    """The folder a batch shot's outputs go to under ``--out``: the folders of its name in the report (a
    server-side import's path under the import root, ``night/x/frame_00.dng`` -> ``night/x``); uploaded shots'
    names have none. Never a path out of ``--out`` (``..``, a root or drive dropped)."""
    parts = PurePosixPath(name.replace("\\", "/")).parent.parts
    return Path(*[p for p in parts if p not in ("", ".", "..", "/") and ":" not in p and p.isprintable()])


def download_batch(client: httpx.Client, shots: list[dict[str, Any]], out: Path, console: Console
                   ) -> tuple[list[Path], list[str]]:
    """Save every rendered shot's outputs of a batch report into ``out`` (in its folders: :func:`shot_folder`),
    in the report's order: verified against
    their sha256, a file already there with the same bytes kept (a second run fetches only what is new), two
    shots' outputs of one name both kept (``_2``). Returns the paths and one line per shot not saved (not done
    yet, failed, cancelled, or a download that failed); an unreachable API raises."""
    taken: set[str] = set()
    saved: list[Path] = []
    problems: list[str] = []
    for shot in shots:
        if shot["status"] != "done":
            problems.append(f"{shot['name']}: {shot['status']}" + (f": {shot['error']}" if shot.get("error") else ""))
            continue
        try:
            saved += download_outputs(client, {"outputs": shot["outputs"]}, out / shot_folder(shot["name"]), console,
                                      taken)
        except Unreachable:
            raise
        except SubmitError as exc:
            problems.append(f"{shot['name']}: {exc}")
    return saved, problems


__all__ = ["ShotResult", "check_recipes", "download_batch", "download_results", "exit_code", "offered_recipes",
           "post_shot", "shot_fields", "upload_shots", "wait_for_batch", "wait_for_shots"]
