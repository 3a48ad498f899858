"""HTTP client side of `strata submit`: streaming upload with progress, polling, download."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import unquote

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

T = TypeVar("T")


class SubmitError(Exception):
    """A request or a job that did not succeed (exit code 1). ``status`` and ``api_type``: the HTTP status and the
    API's error ``type`` where the API answered (``422``, ``not_a_raw_file``), so callers can tell whose fault a
    refusal is."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None, api_type: str | None = None) -> None:
        super().__init__(message)
        self.status, self.api_type = status, api_type


class Unreachable(SubmitError):
    """The API did not answer, or answered 5xx: worth trying again (exit code 3 once the retries are spent)."""

    exit_code = 3


class AuthRefused(SubmitError):
    """The API refused the station's token (401; exit code 4)."""

    exit_code = 4


class BadUsage(SubmitError):
    """A value the service does not offer, e.g. an unknown recipe (exit code 2, as for typer's usage errors)."""

    exit_code = 2


class FileGone(SubmitError):
    """A file to send was deleted or moved after it was found (a reject deleted from the hot folder): that shot is
    not sent, the others go on (exit code 1 at the end, as for a refused shot)."""


@contextmanager
def still_there() -> Iterator[None]:
    """Turns a file that vanished under the block (hashing, measuring, opening it) into :class:`FileGone`."""
    try:
        yield
    except FileNotFoundError as exc:
        raise FileGone(f"{exc.filename}: gone before it was sent (deleted or moved)") from exc


def upload_name(path: Path) -> str:
    """The file name sent with an upload: the name's bytes read as UTF-8, bytes that are not UTF-8 replaced (a
    Latin-1 ``café.dng`` from an old share became a str that httpx cannot encode, and the upload crashed)."""
    return os.fsencode(path.name).decode("utf-8", "replace")


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH = 0, 1, 2, 3, 4
RETRY_FOR_S = 30.0  # how long a command keeps retrying an API that does not answer (`strata --retry-for`)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _ProgressReader:
    """A file wrapper that reports bytes read to a progress bar (httpx streams it in chunks)."""

    def __init__(self, path: Path, progress: Progress, *tasks: Any) -> None:
        self.f = open(path, "rb")  # noqa: SIM115 - closed by the caller
        self.progress, self.tasks = progress, tasks
        self.sent = 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n if n and n > 0 else 1 << 20)
        self.sent += len(data)
        for task in self.tasks:
            self.progress.advance(task, len(data))
        return data

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(1 << 20):
            yield chunk

    def close(self) -> None:
        self.f.close()


def _error(resp: httpx.Response) -> SubmitError:
    kind: type[SubmitError] = SubmitError
    if resp.status_code == 401:
        kind = AuthRefused
    elif resp.status_code >= 500:
        kind = Unreachable
    elif resp.status_code == 409 and "Idempotency-Key is in progress" in resp.text:
        kind = Unreachable  # a retry while the first try is still being recorded: retried like a 5xx
    try:
        body = resp.json()
        return kind(f"{resp.status_code} {body.get('type')}: {body.get('detail')}", resp.status_code, body.get("type"))
    except ValueError:
        return kind(f"{resp.status_code}: {resp.text[:200]}", resp.status_code)


def unreachable(client: httpx.Client, exc: Exception) -> Unreachable:
    return Unreachable(f"cannot reach the Strata API at {client.base_url}: {exc}")


def submit_shot(api: str, token: str, files: list[Path], *, camera: str | None, recipe: str, priority: str,
                wait: bool, out_dir: Path, timeout: float, console: Console) -> list[Path]:
    """Upload ``files`` as one job; with ``wait``, poll until it ends and download the outputs."""
    data: dict[str, str | list[str]] = {"recipe": recipe, "priority": priority,
                                        "sha256": [_sha256(p) for p in files]}
    if camera:
        data["camera"] = camera
    total = sum(p.stat().st_size for p in files)
    with connect(api, token) as client, Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=console
    ) as progress:
        task = progress.add_task("upload", total=total)
        readers = [_ProgressReader(p, progress, task) for p in files]
        uploads: list[tuple[str, Any]] = [("frames", (upload_name(p), reader, "application/octet-stream"))
                                          for p, reader in zip(files, readers, strict=True)]
        try:
            resp = client.post("/v1/jobs", data=data, files=uploads)
        except httpx.HTTPError as exc:
            raise SubmitError(f"cannot reach {api}: {exc}") from exc
        finally:
            for reader in readers:
                reader.close()
        if resp.status_code != 202:
            raise _error(resp)
        job = resp.json()
        console.print(f"job {job['id']} queued ({job['camera']}, {len(job['frames'])} frame(s))")
        if not wait:
            return []
        progress.stop()
        job = wait_for_job(client, job, timeout, console)
        return download_outputs(client, job, out_dir, console)


def connect(api: str, token: str, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """An HTTP client for the API with the station's token (a refused or silent connection fails within 5 s)."""
    return httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"},
                        timeout=httpx.Timeout(60, connect=5, read=600), transport=transport)


def with_retry(fn: Callable[[], T], console: Console, retry_for: float | None = None) -> T:
    """``fn()``, tried again with back-off (0.5 s doubling to 8 s) while the API is unreachable, for up to
    ``retry_for`` seconds (default :data:`RETRY_FOR_S`); every failed try is reported on ``console``."""
    deadline = time.monotonic() + (RETRY_FOR_S if retry_for is None else retry_for)
    delay = 0.5
    while True:
        try:
            return fn()
        except Unreachable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            wait = min(delay, left)
            console.print(f"[yellow]{escape(str(exc))}; retrying in {wait:.1f} s[/yellow]")
            time.sleep(wait)
            delay = min(delay * 2, 8.0)


def request(client: httpx.Client, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One API call; its response, or a SubmitError with the API's error type and detail (:class:`Unreachable`
    for no answer or a 5xx, :class:`AuthRefused` for a 401)."""
    try:
        resp = client.request(method, url, **kwargs)
    except httpx.TransportError as exc:
        raise unreachable(client, exc) from exc
    if resp.status_code >= 400:
        raise _error(resp)
    return resp


def call(client: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
    """One API call; its JSON body (errors as for :func:`request`)."""
    return request(client, method, url, **kwargs).json()


def wait_for_job(client: httpx.Client, job: dict[str, Any], timeout: float, console: Console) -> dict[str, Any]:
    """Poll ``job`` with a progress bar (stage, percent, elapsed) until it ends; raises unless it is done.

    An API that stops answering for a while (a restart, a load balancer hiccup) is waited for until ``timeout``;
    the job keeps running on the workers meanwhile."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console) as rendering:
        bar = rendering.add_task(f"render: {job['stage']}", total=100, completed=100 * job["progress"])
        deadline = time.monotonic() + timeout
        lost: Unreachable | None = None
        while job["status"] in ("queued", "running"):
            if time.monotonic() > deadline:
                raise lost or SubmitError(f"job {job['id']} still {job['status']} after {timeout:.0f}s")
            time.sleep(0.5)
            try:
                job = call(client, "GET", f"/v1/jobs/{job['id']}")
                lost = None
            except Unreachable as exc:
                lost = exc
                rendering.update(bar, description=f"render: waiting for the API ({exc})"[:70])
                time.sleep(2.0)
                continue
            rendering.update(bar, description=f"render: {job['stage']}", completed=100 * job["progress"])
    if job["status"] != "done":
        raise SubmitError(job_ended(job))
    return job


def job_ended(job: dict[str, Any]) -> str:
    """``job ID failed: <error>``, or ``job ID cancelled`` where the job has no error to tell."""
    return f"job {job['id']} {job['status']}" + (f": {job['error']}" if job.get("error") else "")


MAX_LOCAL_NAME = 200  # bytes: with a "_2" and ".part" still under the 255 of common file systems
_FILENAME_STAR = re.compile(r"filename\*=UTF-8''([^;\s]+)", re.IGNORECASE)


def local_name(content_disposition: str | None, name: str) -> str:
    """The name to save an output under: the service's ``filename*`` (the shot's own spelling, e.g. ``写真.tif``
    where the output is ``frame_00.tif``) when it is a plain file name with ``name``'s extension, else ``name``."""
    found = _FILENAME_STAR.search(content_disposition or "")
    if not found:
        return name
    offered = unquote(found.group(1))
    plain = (offered == PurePosixPath(offered).name and "\\" not in offered and not offered.startswith(".")
             and all(c.isprintable() for c in offered) and len(offered.encode()) <= MAX_LOCAL_NAME)
    return offered if plain and PurePosixPath(offered).suffix == PurePosixPath(name).suffix else name


def path_key(path: Path) -> str:
    """One spelling per file, to compare paths by: absolute, symlinks resolved, case folded (macOS and Windows disks
    ignore case). ``hot/shot.tif`` and ``/data/hot/shot.tif`` are one file."""
    return str(path.resolve()).casefold()


def destination(name: Path, output: dict[str, Any], taken: set[str], own: set[str]) -> tuple[Path, bool]:
    """Where an output named ``name`` is saved (``<stem>_2<ext>``, ``_3``, ... when ``name`` is not free), and
    True where that file holds the output already (nothing to fetch). Not free: a path taken by another output of
    the run (``taken``, of :func:`path_key`; the choice is added to it), or a file on disk with other bytes: a
    photographer's own ``look.tif``, another shot's output of an earlier run, never overwritten. ``own``: the paths
    this very file's earlier job saved, which it may rewrite (a changed hot-folder file sent again)."""
    dest, n = name, 1
    while True:
        key = path_key(dest)
        if key not in taken:
            if not dest.exists() or key in own:
                break
            if same_file(dest, output["bytes"], output["sha256"]):
                taken.add(key)
                return dest, True
        n += 1
        dest = name.with_name(f"{name.stem}_{n}{name.suffix}")
    taken.add(key)
    return dest, False


def same_file(path: Path, size: int, sha256: str) -> bool:
    """``path`` exists with this size and sha256 (an output an earlier run saved already)."""
    if not path.is_file() or path.stat().st_size != size:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() == sha256


def download_outputs(client: httpx.Client, job: dict[str, Any], out_dir: Path, console: Console,
                     taken: set[str] | None = None, own: set[str] | None = None) -> list[Path]:
    """Download a done job's outputs into ``out_dir`` with a progress bar: each into a .part file, hashed while
    streaming, renamed only once it matches the job's sha256. Each is saved under the shot's own spelling where
    the service offers it (:func:`local_name`), never over a file it did not write (:func:`destination`): a file
    already there with the output's sha256 is kept, not fetched again (a download run again fetches only what is
    new), one with other bytes makes the output take the next ``_N`` name. ``taken``: the paths saved earlier in
    the same run; ``own``: paths that may be rewritten."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SubmitError(f"cannot save outputs in {out_dir}: {exc.strerror or exc}") from exc
    saved = []
    taken = set() if taken is None else taken
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console) as downloading:
        for o in job["outputs"]:
            bar = downloading.add_task(f"download {o['name']}", total=o["bytes"])
            digest = hashlib.sha256()
            part: Path | None = None
            try:
                with client.stream("GET", o["url"], follow_redirects=True) as r:  # STRATA_S3_DOWNLOADS=redirect
                    if r.status_code != 200:
                        r.read()
                        raise _error(r)
                    name = out_dir / local_name(r.headers.get("content-disposition"), o["name"])
                    dest, same = destination(name, o, taken, own or set())
                    if same:
                        downloading.update(bar, completed=o["bytes"])
                        saved.append(dest)
                        continue
                    part = dest.with_name(dest.name + ".part")
                    with open(part, "wb") as f:
                        for chunk in r.iter_bytes(1 << 20):
                            f.write(chunk)
                            digest.update(chunk)
                            downloading.advance(bar, len(chunk))
            except httpx.HTTPError as exc:
                if part is not None:
                    part.unlink(missing_ok=True)
                raise SubmitError(f"download of {o['name']} failed: {exc}") from exc
            except OSError as exc:  # the disk is full, a folder became read-only ...
                if part is not None:
                    part.unlink(missing_ok=True)
                raise SubmitError(f"cannot save {o['name']} in {out_dir}: {exc.strerror or exc}") from exc
            if digest.hexdigest() != o["sha256"]:
                part.unlink(missing_ok=True)
                raise SubmitError(f"downloaded {dest} does not match its sha256")
            try:
                part.replace(dest)
            except OSError as exc:
                raise SubmitError(f"cannot save {dest}: {exc.strerror or exc}") from exc
            saved.append(dest)
    return saved
