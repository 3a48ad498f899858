"""RAW decoding in a child process, so that a LibRaw crash, hang or memory blow-up becomes a RawDecodeError.

``subprocess`` rather than ``multiprocessing``: callers may be daemonic Celery pool processes, which may not
have children of their own through multiprocessing.

Every decode still gets a fresh child, but children are started ahead of need (:class:`_Spares`): a spare has
imported numpy and rawpy and waits for its one file on stdin, so a decode does not pay the interpreter start
(a good part of a 50 MP frame's decode; docs/PERFORMANCE.md). The process keeps as many spares as it has run
decodes at once (at most :data:`MAX_SPARES`; a coordinator starts with :func:`prestart`); a spare exits when its
parent does (end of stdin).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from services.errors import RawDecodeError
from services.raw.fast_dng import BandSink, decode_fast
from services.raw.meta import RawMeta

# The child command without its arguments; tests replace it with a child that crashes or hangs.
CHILD_COMMAND: list[str] = [sys.executable, "-m", "services.raw.decode_child"]
_DEFAULT_COMMAND = list(CHILD_COMMAND)
MAX_SPARES = 16
_REPO_ROOT = Path(__file__).resolve().parents[2]
_STDERR_TAIL = 500
# How running out of address space shows when it hits the child before it can report (e.g. at import).
_OOM_SIGNS = (
    "memoryerror",
    "cannot allocate memory",
    "bad_alloc",
    "failed to map segment",
    "memory allocation",
    "out of memory",
)


def _limit_resources(memory_mb: int) -> None:
    """preexec_fn of the child: cap its address space and disable core dumps."""
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    # One BLAS/OpenMP thread: their per-thread arenas would eat the address-space limit for nothing.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _failure_reason(report: dict[str, str] | None, returncode: int, stderr: str, memory_mb: int) -> str:
    if report is not None and "error" in report:
        kind, message = report["error"], report.get("message", "")
        if kind == "memory":
            return f"out of memory (limit {memory_mb} MiB): {message}"
        if kind == "unsupported":
            return message.split(": ", 1)[-1]
        if kind == "libraw":
            return f"LibRaw: {message}"
        return f"decoder failed: {message}"
    if returncode < 0:
        return f"LibRaw crashed (signal {_signal_name(-returncode)})"
    tail = stderr.strip()[-_STDERR_TAIL:]
    if any(sign in tail.lower() for sign in _OOM_SIGNS):
        return f"out of memory (limit {memory_mb} MiB)"
    return f"decoder exited with code {returncode}: {tail or 'no message'}"


def _spawn(command: list[str], memory_mb: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_child_env(),
        preexec_fn=lambda: _limit_resources(memory_mb),
        start_new_session=True,  # so a timeout kills the child's whole process group
    )


class _Spares:
    """Decoder children started ahead of need (``decode_child -``: imports done, waiting for paths on stdin)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[int, subprocess.Popen[bytes]]] = []  # (memory_mb, child)
        self._running = 0
        self._want = 0
        self._refilling = False
        self._pid = os.getpid()

    def _forked(self) -> None:
        """In a forked process the inherited spares are the parent's children: forget them (caller holds the lock)."""
        if self._pid != os.getpid():
            self._idle, self._running, self._refilling, self._pid = [], 0, False, os.getpid()

    def take(self, memory_mb: int) -> subprocess.Popen[bytes] | None:
        """A live spare with this memory limit (None if there is none); counts one more running decode."""
        with self._lock:
            self._forked()
            self._running += 1
            self._want = min(MAX_SPARES, max(self._want, self._running))
            while self._idle:
                limit, child = self._idle.pop()
                if limit == memory_mb and child.poll() is None:
                    return child
                _discard(child)
        return None

    def done(self) -> None:
        with self._lock:
            self._running -= 1

    def refill(self, memory_mb: int) -> None:
        """Start spares until as many wait as decodes have run at once (one refilling thread at a time: racing
        threads over- and under-shot, and a shot then paid a cold child start)."""
        with self._lock:
            self._forked()
            if self._refilling:
                return
            self._refilling = True
        try:
            while True:
                with self._lock:
                    if len(self._idle) >= self._want:
                        return
                child = _spawn([*_DEFAULT_COMMAND, "-"], memory_mb)
                with self._lock:
                    self._idle.append((memory_mb, child))
        finally:
            with self._lock:
                self._refilling = False

    def refill_later(self, memory_mb: int) -> None:
        """Refill on a thread, called as a decode ends: refilling as each decode started had the new spares
        importing numpy and rawpy beside the running decodes (a stack's decode time doubled from run to run;
        docs/PERFORMANCE.md), and racing refill threads left too few spares for the next shot."""
        threading.Thread(target=self.refill, args=(memory_mb,), daemon=True).start()


def prestart(count: int, memory_mb: int = 8192) -> None:
    """Have ``count`` spares (at most :data:`MAX_SPARES`) waiting before the first decode (a coordinator starting)."""
    with _spares._lock:
        _spares._want = min(MAX_SPARES, max(_spares._want, count))
    threading.Thread(target=_spares.refill, args=(memory_mb,), daemon=True).start()


def _discard(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()
    child.communicate()


_spares = _Spares()


def decode_raw(path: Path, out_npy: Path, *, timeout_s: float = 300.0, memory_mb: int = 8192,
               fast_dng: bool = True, threads: int = 1, binner: BandSink | None = None) -> RawMeta:
    """Decode ``path`` in a child process; write its visible Bayer mosaic (uint16 .npy) to ``out_npy``.

    ``fast_dng``: an uncompressed Bayer DNG is read straight from the file instead (:mod:`services.raw.fast_dng`,
    same result, no LibRaw, no child), copied on ``threads`` threads and fed to ``binner`` on the way (the fast
    preview's bin sums; it stays not ``ready`` when LibRaw decodes the file).

    Returns the frame's metadata. Raises ``RawDecodeError`` if the decoder fails, crashes, exceeds
    ``memory_mb`` of address space or runs longer than ``timeout_s`` seconds.
    """
    path, out_npy = Path(path), Path(out_npy)
    if fast_dng:
        meta = decode_fast(path, out_npy, threads=threads, binner=binner)
        if meta is not None:
            return meta
    with tempfile.TemporaryDirectory(prefix="strata-decode-") as tmp:
        out_json = Path(tmp) / "meta.json"
        args = [str(path), str(out_npy), str(out_json)]
        # Tests swap in children that crash or hang, and a spare reads one path per line: those start cold.
        warm = CHILD_COMMAND == _DEFAULT_COMMAND and not any("\n" in a for a in args)
        proc = _spares.take(memory_mb) if warm else None
        try:
            if proc is None:
                proc = _spawn([*CHILD_COMMAND, "-"] if warm else [*CHILD_COMMAND, *args], memory_mb)
            request = "\n".join(args).encode() if warm else None
            try:
                _, stderr_bytes = proc.communicate(request, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise RawDecodeError(f"decode timed out after {timeout_s:g}s") from None
        finally:
            if warm:
                _spares.done()
                _spares.refill_later(memory_mb)
        stderr = stderr_bytes.decode("utf-8", "replace")
        report: dict[str, str] | None = None
        if out_json.exists():
            try:
                report = json.loads(out_json.read_text())
            except (OSError, ValueError):
                report = None
        if proc.returncode != 0 or report is None or "meta" not in report:
            out_npy.unlink(missing_ok=True)
            out_npy.with_name(out_npy.name + ".part").unlink(missing_ok=True)
            raise RawDecodeError(_failure_reason(report, proc.returncode, stderr, memory_mb))
        if not out_npy.exists():
            raise RawDecodeError("decoder reported success but wrote no pixels")
        return RawMeta.from_dict(report["meta"])  # type: ignore[arg-type]
