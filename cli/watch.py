"""`strata watch DIR`: a hot folder. Every RAW file that lands in DIR (recursively) is uploaded once it is
completely written, and its outputs are downloaded beside it (or under ``--out``).

- **Complete**: a file is sent when its size and mtime were the same at two polls at least ``settle`` seconds
  apart. Dotfiles, ``~`` files and partial copies (``*.part``, ``*.tmp``, ...) are never sent.
- **Remembered**: ``DIR/.strata-watch.json`` (written atomically: a temporary file, fsync, rename) holds per file
  its size, mtime, sha256, job id, status and saved outputs. A restart sends nothing already sent and collects
  the outputs of jobs that finished meanwhile; a file whose size or mtime changed is hashed again and, if its
  content changed, sent again as a new shot.
- **Never dropped**: while the API does not answer, files stay pending and jobs uncollected; the watcher says so
  and tries again with back-off. A file the API refuses for itself (not a RAW file, too large, ...) is recorded as
  ``refused`` and not retried until it changes; a refusal of the watcher's own options (an unknown recipe, a
  camera that takes stacks) is recorded against no file: the watcher stops (exit 2) to have them fixed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from cli.client import (
    BadUsage,
    FileGone,
    SubmitError,
    Unreachable,
    _sha256,
    call,
    download_outputs,
    job_ended,
    path_key,
    still_there,
)
from cli.discovery import Shot, find_raw_files
from cli.station import ENDED, post_shot, shot_fields

STATE_NAME = ".strata-watch.json"
STATE_VERSION = 1
PENDING = ("queued", "running")
# The API's error types (docs/API.md) of a refused upload that blame the request, i.e. the watcher's options, not
# the file: recorded against no file, they stop the watcher. Those of FILE_FAULTS blame the file: it is recorded
# as refused. Any other refusal stops the watcher with nothing recorded (the file is sent again next time).
OPTION_FAULTS = frozenset({"invalid_input", "unknown_camera", "invalid_naming", "invalid_recipe"})
FILE_FAULTS = frozenset({"not_a_raw_file", "unsupported_sensor", "frames_mismatch", "upload_too_large",
                         "checksum_mismatch"})
# What every entry holds, and of which type: an entry without them would crash the watcher later.
ENTRY_TYPES: dict[str, tuple[type, ...]] = {"size": (int,), "mtime_ns": (int,), "sha256": (str,), "status": (str,),
                                            "job": (str, type(None)), "saved": (list,)}


def _state_problem(body: Any) -> str | None:
    """Why ``body`` is not a watch state file of :data:`STATE_VERSION` or older, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("files"), dict):
        return 'no "files" object'
    if not isinstance(body.get("version"), int) or body["version"] < 1:
        return f"version {body.get('version')!r}"
    for rel, entry in body["files"].items():
        if not isinstance(entry, dict):
            return f"the entry of {rel!r} is not an object"
        bad = [k for k, kinds in ENTRY_TYPES.items() if not isinstance(entry.get(k), kinds)]
        if bad or not all(isinstance(p, str) for p in entry["saved"]):
            return f"the entry of {rel!r} lacks {', '.join(bad) or 'saved'} or holds another type there"
    return None


def _refused_for_options(entry: dict[str, Any]) -> bool:
    """An entry an earlier release recorded as refused for the watcher's options (``422 invalid_input: unknown
    recipe ...``), not for the file: sent again rather than skipped until the file changes."""
    words = str(entry.get("error") or "").split(":", 1)[0].split()
    return entry["status"] == "refused" and len(words) == 2 and words[1] in OPTION_FAULTS


class WatchState:
    """The watcher's memory of what it sent: ``{"version": 1, "files": {relpath: entry}}`` in DIR."""

    def __init__(self, root: Path) -> None:
        self.path = root / STATE_NAME
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.files: dict[str, dict[str, Any]] = {}

    def load(self) -> WatchState:
        """Read the state; :class:`BadUsage` (exit 2) for a file that is not one, holds a broken entry or was
        written by a newer release, rather than sending every file again or crashing on it later."""
        if not self.path.exists():
            return self
        problem: str | None
        try:
            body = json.loads(self.path.read_text())
            problem = _state_problem(body)
        except (OSError, ValueError) as exc:  # OSError: e.g. a folder of that name
            body, problem = None, str(exc)
        if problem:
            raise BadUsage(f"{self.path} is not a watch state file ({problem}); move it away to start afresh "
                           "(every file in the folder is then sent again)")
        if body["version"] > STATE_VERSION:
            raise BadUsage(f"{self.path} was written by a newer strata (state version {body['version']}; this one "
                           f"reads {STATE_VERSION}): run that release, or move the file away to start afresh")
        self.files = dict(body["files"])
        return self

    def check_writable(self) -> None:
        """:class:`BadUsage` (exit 2) where the state file cannot be written (a read-only share): checked before
        anything is sent, else every start uploads a shot, fails to record it, and uploads it again next time."""
        try:
            self.tmp.touch()
            self.tmp.unlink()
        except OSError as exc:
            raise BadUsage(f"the hot folder {self.path.parent} cannot be written ({exc.strerror or exc}): the "
                           f"watcher keeps its state file {STATE_NAME} there, to remember what it sent; make "
                           "the folder writable (outputs can go elsewhere with --out)") from None

    def save(self) -> None:
        """Write the state atomically: readers see the old file or the new one, never half of one. One that cannot
        be written (the share went read-only, the disk is full) stops the watcher (:class:`BadUsage`)."""
        try:
            with open(self.tmp, "w") as f:
                json.dump({"version": STATE_VERSION, "files": self.files}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.tmp, self.path)
        except OSError as exc:
            raise BadUsage(f"cannot write the watch state {self.path}: {exc.strerror or exc}") from None

    def unchanged(self, rel: str, st: os.stat_result) -> bool:
        """``rel`` is recorded with this very size and mtime: nothing to do for it."""
        entry = self.files.get(rel)
        return (entry is not None and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns
                and not _refused_for_options(entry))


@dataclass
class Settler:
    """Tells when a file is completely written: the same (size, mtime) seen at polls ``settle`` s apart."""

    settle: float
    seen: dict[str, tuple[int, int, float]] = field(default_factory=dict)

    def observe(self, rel: str, st: os.stat_result, now: float) -> bool:
        key = (st.st_size, st.st_mtime_ns)
        before = self.seen.get(rel)
        if before is None or before[:2] != key:
            self.seen[rel] = (*key, now)
            return False
        return now - before[2] >= self.settle

    def forget(self, rel: str) -> None:
        self.seen.pop(rel, None)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Watcher:
    """One hot folder: :meth:`poll` sends what is complete, :meth:`collect` saves what finished."""

    def __init__(self, root: Path, client: httpx.Client, console: Console, *, fields: dict[str, Any],
                 out: Path | None = None, settle: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        # resolved: the paths saved are compared with those of runs that spelled DIR another way
        self.root, self.out = root.resolve(), None if out is None else out.resolve()
        self.client, self.console, self.fields = client, console, fields
        self.state = WatchState(self.root).load()
        self.state.check_writable()
        self.settler = Settler(settle)
        self.clock = clock
        self.failed: list[str] = []
        self.refused: list[str] = []  # files the API refused (4xx) in this run

    def log(self, message: str, style: str = "") -> None:
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        text = escape(message)
        self.console.print(f"{stamp} [{style}]{text}[/{style}]" if style else f"{stamp} {text}")

    def ready(self) -> list[tuple[str, Path, os.stat_result]]:
        """Files complete and not yet sent in their present form."""
        now = self.clock()
        found = []
        for path in find_raw_files(self.root):
            rel = path.relative_to(self.root).as_posix()
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if self.state.unchanged(rel, st):
                self.settler.forget(rel)
            elif self.settler.observe(rel, st, now):
                found.append((rel, path, st))
        return found

    def poll(self) -> int:
        """Send every complete new or changed file; how many were sent. Raises :class:`Unreachable`."""
        sent = 0
        for rel, path, st in self.ready():
            sent += self._send(rel, path, st)
        return sent

    def _send(self, rel: str, path: Path, st: os.stat_result) -> int:
        try:
            with still_there():
                sha, now = _sha256(path), path.stat()
        except FileGone:
            return self._gone(rel)
        if now.st_mtime_ns != st.st_mtime_ns or now.st_size != st.st_size:
            self.settler.forget(rel)  # written to while hashed: not complete after all
            return 0
        entry = {"size": st.st_size, "mtime": st.st_mtime, "mtime_ns": st.st_mtime_ns, "sha256": sha}
        known = self.state.files.get(rel)
        if known and known.get("sha256") == sha and known.get("status") != "refused":
            known.update(entry)  # touched, same content: not a new shot
            self.state.save()
            return 0
        try:
            job = self._post(rel, path, sha)
        except FileGone:
            return self._gone(rel)
        except SubmitError as exc:
            if exc.exit_code != 1:
                raise
            self._refused(rel, entry, exc)
            return 0
        self.state.files[rel] = {**entry, "job": job["id"], "status": job["status"], "error": None, "saved": [],
                                 "sent_at": _now()}
        self.state.save()
        self.log(f"{rel}: sent, job {job['id']} ({job['camera']})")
        return 1

    def _post(self, rel: str, path: Path, sha: str) -> dict[str, Any]:
        """Upload ``path`` as one shot with a progress bar; the job."""
        shot = Shot((path,))
        # the same key for the same file, content and options: a watcher killed between the upload and saving its
        # state sends it again on restart and gets the job back (within STRATA_IDEMPOTENCY_HOURS); other options
        # make another request, which the API would refuse under the first one's key
        options = json.dumps(self.fields, sort_keys=True).encode()
        key = "strata-watch-" + hashlib.sha256(b"\0".join((os.fsencode(rel), sha.encode(), options))).hexdigest()[:40]
        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      console=self.console) as progress:
            return post_shot(self.client, "/v1/jobs", shot, shot_fields(shot, **self.fields, sha256=[sha]), progress,
                             key=key)

    def _gone(self, rel: str) -> int:
        """``rel`` vanished before it was sent (a reject deleted): not recorded, it is sent if it comes back."""
        self.settler.forget(rel)
        self.log(f"{rel}: gone before it was sent (deleted or moved); not sent")
        return 0

    def _refused(self, rel: str, entry: dict[str, Any], exc: SubmitError) -> None:
        """A refusal of the file itself is recorded (not sent again until it changes); one of the watcher's options
        stops it with exit 2 and any other with exit 1, nothing recorded: the file is sent once the cause is
        fixed (a bad --recipe recorded every file as refused, and a restart with a good one sent nothing)."""
        if exc.api_type in OPTION_FAULTS:
            raise BadUsage(f"the API refused the watcher's options: {exc}; nothing was recorded for {rel}: fix the "
                           "option (--camera, --recipe, --priority) and start the watcher again") from exc
        if exc.api_type not in FILE_FAULTS:
            raise SubmitError(f"{rel}: {exc}; nothing was recorded: the file is sent again at the next start",
                              exc.status, exc.api_type) from exc
        self.state.files[rel] = {**entry, "job": None, "status": "refused", "error": str(exc), "saved": [],
                                 "sent_at": _now()}
        self.state.save()
        self.log(f"{rel}: refused by the API: {exc}", "red")
        self.refused.append(rel)

    def pending(self) -> list[str]:
        """Files whose job has not ended, or ended done with outputs not saved yet."""
        return [rel for rel, e in self.state.files.items()
                if e.get("job") and (e["status"] in PENDING or (e["status"] == "done" and not e.get("saved")))]

    def collect(self) -> None:
        """Ask after every pending job; save the outputs of those done. Raises :class:`Unreachable`."""
        for rel in self.pending():
            entry = self.state.files[rel]
            try:
                job = call(self.client, "GET", f"/v1/jobs/{entry['job']}")
            except SubmitError as exc:
                if exc.exit_code != 1:
                    raise
                job = {"id": entry["job"], "status": "failed", "error": f"the API lost the job: {exc}"}
            if job["status"] == "done":
                self._save_outputs(rel, entry, job)
            elif job["status"] in ENDED and job["status"] != entry["status"]:
                entry.update(status=job["status"], error=job.get("error"))
                self.state.save()
                self.failed.append(rel)
                self.log(f"{rel}: {job_ended(job)}", "red")
            elif job["status"] != entry["status"]:
                entry["status"] = job["status"]
                self.state.save()

    def _saved_paths(self, rel: str) -> tuple[set[str], set[str]]:
        """The :func:`path_key`s of what other files' outputs were saved under (``shot.IIQ``'s ``shot.tif`` is kept
        when ``shot.dng`` arrives later: that one's becomes ``shot_2.tif``), and of ``rel``'s own, which it
        rewrites when it is sent again. A path saved by a run that spelled DIR another way is the same key."""
        others: set[str] = set()
        own: set[str] = set()
        for other, e in self.state.files.items():
            (own if other == rel else others).update(path_key(Path(p)) for p in e.get("saved") or [])
        return others, own

    def _save_outputs(self, rel: str, entry: dict[str, Any], job: dict[str, Any]) -> None:
        """Download a done job's outputs; a download that fails is tried again at the next poll, except outputs
        the service removed (410 gone: ``strata jobs remove-files``, retention), which end the entry."""
        dest = (self.root / rel).parent if self.out is None else self.out / Path(rel).parent
        try:
            paths = download_outputs(self.client, job, dest, self.console, *self._saved_paths(rel))
        except Unreachable:
            raise
        except SubmitError as exc:
            if exc.status != 410:
                self.log(f"{rel}: download failed, will try again: {exc}", "yellow")
                return
            entry.update(status="gone", error=str(exc))
            self.state.save()
            self.failed.append(rel)
            self.log(f"{rel}: the outputs of job {job['id']} are gone from the service (removed); not saved: {exc}",
                     "red")
            return
        entry.update(status="done", error=None, saved=[str(p) for p in paths])
        self.state.save()
        self.log(f"{rel}: done, saved {', '.join(p.name for p in paths)}", "green")


def watch_forever(watcher: Watcher, interval: float, stop: threading.Event | None = None) -> None:
    """Poll and collect every ``interval`` seconds until ``stop`` is set (SIGTERM) or interrupted; an unreachable
    API backs off (doubling up to 30 s) and is reported at every try, files staying pending. A stop lets the step
    under way (a download and the state saved after it) finish first."""
    stop = stop or threading.Event()
    backoff = 0.0
    while not stop.is_set():
        try:
            watcher.poll()
            watcher.collect()
        except Unreachable as exc:
            backoff = min(max(interval, backoff * 2), 30.0)
            watcher.log(f"{exc}; {len(watcher.pending())} job(s) to collect, files stay pending; "
                        f"retrying in {backoff:.1f} s", "yellow")
            stop.wait(backoff)
            continue
        if backoff:
            watcher.log("the API answers again", "green")
            backoff = 0.0
        stop.wait(interval)


def _retrying(watcher: Watcher, step: Callable[[], object], retry_for: float) -> None:
    """``step()``, tried again with back-off while the API is unreachable, for up to ``retry_for`` seconds."""
    deadline, delay = time.monotonic() + retry_for, 0.5
    while True:
        try:
            step()
            return
        except Unreachable as exc:
            if time.monotonic() >= deadline:
                raise
            watcher.log(f"{exc}; retrying in {delay:.1f} s", "yellow")
            time.sleep(delay)
            delay = min(delay * 2, 8.0)


def watch_once(watcher: Watcher, *, timeout: float, retry_for: float) -> int:
    """One pass: look, wait ``settle``, send what stayed the same, then wait (up to ``timeout``) for every pending
    job and save its outputs. 0, or 1 if a job failed or the API refused a file (docs/STATION.md's exit codes);
    raises :class:`Unreachable` once ``retry_for`` is spent."""
    watcher.ready()
    time.sleep(watcher.settler.settle + 0.05)
    _retrying(watcher, watcher.poll, retry_for)
    deadline = time.monotonic() + timeout
    while True:
        _retrying(watcher, watcher.collect, retry_for)
        if not watcher.pending():
            break
        if time.monotonic() > deadline:
            watcher.log(f"{len(watcher.pending())} job(s) still running after {timeout:g} s; the next run "
                        "collects them", "yellow")
            return 1
        time.sleep(0.5)
    return 1 if watcher.failed or watcher.refused else 0


__all__ = ["STATE_NAME", "Settler", "WatchState", "Watcher", "watch_forever", "watch_once"]
