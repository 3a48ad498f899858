"""HTTP client side of `strata submit`: streaming upload with progress, polling, download."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
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
    """A request or a job that did not succeed (exit code 1)."""

    exit_code = 1


class Unreachable(SubmitError):
    """The API did not answer, or answered 5xx: worth trying again (exit code 3 once the retries are spent)."""

    exit_code = 3


class AuthRefused(SubmitError):
    """The API refused the station's token (401; exit code 4)."""

    exit_code = 4


class BadUsage(SubmitError):
    """A value the service does not offer, e.g. an unknown recipe (exit code 2, as for typer's usage errors)."""

    exit_code = 2


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
        return kind(f"{resp.status_code} {body.get('type')}: {body.get('detail')}")
    except ValueError:
        return kind(f"{resp.status_code}: {resp.text[:200]}")


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
        uploads: list[tuple[str, Any]] = [("frames", (p.name, reader, "application/octet-stream"))
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
        raise SubmitError(f"job {job['id']} {job['status']}: {job.get('error')}")
    return job


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


def unique_path(dest: Path, taken: set[str] | None) -> Path:
    """``dest``, or ``<stem>_2<ext>``, ``_3``, ... when an earlier download of the same run took it (compared
    case-insensitively, as macOS and Windows disks do); records the path taken. ``taken`` None: ``dest``."""
    if taken is None:
        return dest
    candidate, n = dest, 1
    while str(candidate).casefold() in taken:
        n += 1
        candidate = dest.with_name(f"{dest.stem}_{n}{dest.suffix}")
    taken.add(str(candidate).casefold())
    return candidate


def destination(name: Path, taken: set[str] | None, kept: dict[str, Any] | None) -> tuple[Path, bool]:
    """Where an output named ``name`` is saved: :func:`unique_path`'s choice, and with ``kept`` (the output, a
    download run again) a path that already holds it (then True: nothing to fetch) or one that is free: a file
    there with other bytes is another shot's from an earlier run (shots finish in any order), never overwritten."""
    if kept is None:
        return unique_path(name, taken), False
    seen = taken if taken is not None else set()
    dest, n = name, 1
    while str(dest).casefold() in seen or (dest.exists() and not same_file(dest, kept["bytes"], kept["sha256"])):
        n += 1
        dest = name.with_name(f"{name.stem}_{n}{name.suffix}")
    seen.add(str(dest).casefold())
    return dest, dest.exists()


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
                     taken: set[str] | None = None, keep_same: bool = False) -> list[Path]:
    """Download a done job's outputs into ``out_dir`` with a progress bar: each into a .part file, hashed while
    streaming, renamed only once it matches the job's sha256. Each is saved under the shot's own spelling where
    the service offers it (:func:`local_name`); ``taken``: the paths saved earlier in the same run (``strata
    submit``), never overwritten by another shot's output (:func:`unique_path`); ``keep_same``: a file already
    there with the output's sha256 is kept, not fetched again, and one with other bytes is never overwritten
    (``strata batch download`` run again: the output takes the next ``_N`` name)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SubmitError(f"cannot save outputs in {out_dir}: {exc.strerror or exc}") from exc
    saved = []
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
                    dest, same = destination(name, taken, o if keep_same else None)
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
