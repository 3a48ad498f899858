"""`strata watch DIR`: a hot folder. Every RAW file that lands in DIR (recursively) is uploaded once it is
completely written, and its outputs are downloaded beside it (or under ``--out``).

- **Complete**: a file is sent when its size and mtime were the same at two polls at least ``settle`` seconds
  apart. Dotfiles, ``~`` files and partial copies (``*.part``, ``*.tmp``, ...) are never sent.
- **Remembered**: ``DIR/.strata-watch.json`` (written atomically: a temporary file, fsync, rename) holds per file
  its size, mtime, sha256, job id, status and saved outputs. A restart sends nothing already sent and collects
  the outputs of jobs that finished meanwhile; a file whose size or mtime changed is hashed again and, if its
  content changed, sent again as a new shot.
- **Never dropped**: while the API does not answer, files stay pending and jobs uncollected; the watcher says so
  and tries again with back-off. A file the API refuses (4xx, e.g. not a RAW file) is recorded as ``refused``
  and not retried until it changes.
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

from cli.client import BadUsage, SubmitError, Unreachable, _sha256, call, download_outputs
from cli.discovery import Shot, find_raw_files
from cli.station import ENDED, post_shot, shot_fields

STATE_NAME = ".strata-watch.json"
STATE_VERSION = 1
PENDING = ("queued", "running")


class WatchState:
    """The watcher's memory of what it sent: ``{"version": 1, "files": {relpath: entry}}`` in DIR."""

    def __init__(self, root: Path) -> None:
        self.path = root / STATE_NAME
        self.files: dict[str, dict[str, Any]] = {}

    def load(self) -> WatchState:
        if self.path.exists():
            try:
                body = json.loads(self.path.read_text())
                self.files = dict(body["files"])
            except (ValueError, KeyError, TypeError) as exc:
                raise BadUsage(f"{self.path} is not a watch state file ({exc}); move it away to start afresh "
                               "(every file in the folder is then sent again)") from exc
        return self

    def save(self) -> None:
        """Write the state atomically: readers see the old file or the new one, never half of one."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"version": STATE_VERSION, "files": self.files}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def unchanged(self, rel: str, st: os.stat_result) -> bool:
        """``rel`` is recorded with this very size and mtime: nothing to do for it."""
        entry = self.files.get(rel)
        return entry is not None and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns


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
        self.root, self.client, self.console, self.fields, self.out = root, client, console, fields, out
        self.state = WatchState(root).load()
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
        sha = _sha256(path)
        if path.stat().st_mtime_ns != st.st_mtime_ns or path.stat().st_size != st.st_size:
            self.settler.forget(rel)  # written to while hashed: not complete after all
            return 0
        entry = {"size": st.st_size, "mtime": st.st_mtime, "mtime_ns": st.st_mtime_ns, "sha256": sha}
        known = self.state.files.get(rel)
        if known and known.get("sha256") == sha and known.get("status") != "refused":
            known.update(entry)  # touched, same content: not a new shot
            self.state.save()
            return 0
        shot = Shot((path,))
        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      console=self.console) as progress:
            try:
                # the same key for the same file and content: a watcher killed between the upload and saving its
                # state sends it again on restart and gets the job back (within STRATA_IDEMPOTENCY_HOURS)
                key = "strata-watch-" + hashlib.sha256(f"{rel}\0{sha}".encode()).hexdigest()[:40]
                job = post_shot(self.client, "/v1/jobs", shot, shot_fields(shot, **self.fields, sha256=[sha]),
                                progress, key=key)
            except SubmitError as exc:
                if exc.exit_code != 1:
                    raise
                self.state.files[rel] = {**entry, "job": None, "status": "refused", "error": str(exc),
                                         "saved": [], "sent_at": _now()}
                self.state.save()
                self.log(f"{rel}: refused by the API: {exc}", "red")
                self.refused.append(rel)
                return 0
        self.state.files[rel] = {**entry, "job": job["id"], "status": job["status"], "error": None, "saved": [],
                                 "sent_at": _now()}
        self.state.save()
        self.log(f"{rel}: sent, job {job['id']} ({job['camera']})")
        return 1

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
                self.log(f"{rel}: job {job['id']} {job['status']}: {job.get('error')}", "red")
            elif job["status"] != entry["status"]:
                entry["status"] = job["status"]
                self.state.save()

    def _taken_by_others(self, rel: str) -> set[str]:
        """The paths other files' outputs were saved under (``shot.IIQ``'s ``shot.tif`` is kept when ``shot.dng``
        arrives later: that one's becomes ``shot_2.tif``); ``rel``'s own are rewritten when it is sent again."""
        return {p.casefold() for other, e in self.state.files.items() if other != rel for p in e.get("saved") or []}

    def _save_outputs(self, rel: str, entry: dict[str, Any], job: dict[str, Any]) -> None:
        dest = (self.root / rel).parent if self.out is None else self.out / Path(rel).parent
        try:
            paths = download_outputs(self.client, job, dest, self.console, self._taken_by_others(rel))
        except Unreachable:
            raise
        except SubmitError as exc:
            self.log(f"{rel}: download failed, will try again: {exc}", "yellow")
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
