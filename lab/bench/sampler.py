"""Resource sampling while a benchmark runs: GPU and CPU busy fractions, GPU memory per process, host memory.

A thread samples every ``interval`` seconds: NVML (``nvidia-ml-py``, where a GPU driver exists) for each GPU's
utilisation and the memory of each process on it, psutil for the busy fraction of all cores, the host's used
memory, each disk's bytes and busy time (``/proc/diskstats``: where a batch waits on the disk) and each process's
CPU seconds, labelled by role (a Celery worker by its node name without the host, the
``strata serve`` process, redis, this benchmark; the rest "other"), so a window says how many core-seconds each role
spent.
``window(t0, t1)`` summarises the samples taken between two ``time.monotonic()`` stamps, so one sampler serves
every scenario of a run.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil


@dataclass
class Sample:
    t: float
    cpu_busy: float  # 0..1 over all cores
    host_used_bytes: int
    gpu_busy: list[float] = field(default_factory=list)  # 0..1 per GPU
    gpu_process_bytes: dict[int, int] = field(default_factory=dict)  # pid -> bytes on any GPU
    cpu_seconds: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid -> (role, user + system seconds)
    disks: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # disk -> (read, written bytes, busy ms)


def role(cmdline: list[str]) -> str:
    """A process's role for the CPU breakdown: a Celery worker's node name without ``@host`` (``coordinator``,
    ``gpu0``, ``cpu1``), ``serve`` for ``strata serve`` (API, launcher), ``redis``, ``kernel`` for kernel threads
    (no command line: page writeback, I/O); else ``other``."""
    if not cmdline:
        return "kernel"
    if "-n" in cmdline[:-1] and any("celery" in part for part in cmdline):
        return cmdline[cmdline.index("-n") + 1].split("@")[0]
    text = " ".join(cmdline[:4])
    if "redis-server" in text or "valkey" in text:
        return "redis"
    if "serve" in cmdline[:4] or "uvicorn" in text:
        return "serve"
    return "other"


class _Processes:
    """Each process's role (read once per pid) and CPU seconds."""

    def __init__(self) -> None:
        self.roles: dict[int, str] = {}

    def read(self) -> dict[int, tuple[str, float]]:
        out: dict[int, tuple[str, float]] = {}
        for proc in psutil.process_iter():
            try:
                if proc.pid not in self.roles:
                    self.roles[proc.pid] = "bench" if proc.pid == os.getpid() else role(proc.cmdline())
                times = proc.cpu_times()
                out[proc.pid] = (self.roles[proc.pid], times.user + times.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return out


class _Nvml:
    """NVML handles, or nothing where no NVIDIA driver is loaded (then GPU columns stay empty)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no driver, no library: a CPU host
            self.handles = []

    def read(self) -> tuple[list[float], dict[int, int]]:
        busy: list[float] = []
        per_pid: dict[int, int] = {}
        for h in self.handles:
            busy.append(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = int(proc.usedGpuMemory or 0)
                per_pid[int(proc.pid)] = per_pid.get(int(proc.pid), 0) + used
        return busy, per_pid


class ResourceSampler:
    """Start with :meth:`start`, stop with :meth:`stop`; :meth:`window` summarises a time span."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._nvml = _Nvml()
        self._procs = _Processes()

    @property
    def gpus(self) -> int:
        return len(self._nvml.handles)

    def start(self) -> ResourceSampler:
        psutil.cpu_percent(interval=None)  # the first reading only sets the baseline
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            busy, per_pid = self._nvml.read() if self._nvml.handles else ([], {})
            self.samples.append(Sample(time.monotonic(), psutil.cpu_percent(interval=None) / 100.0,
                                       int(psutil.virtual_memory().used), busy, per_pid, self._procs.read(),
                                       _disks()))

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """Mean busy fractions and peaks of the samples taken in [t0, t1] (empty dict when none were)."""
        inside = [s for s in self.samples if t0 <= s.t <= t1]
        if not inside:
            return {}
        out: dict[str, Any] = {
            "samples": len(inside),
            "cpu_busy_mean": sum(s.cpu_busy for s in inside) / len(inside),
            "cpu_busy_max": max(s.cpu_busy for s in inside),
            "host_used_peak_bytes": max(s.host_used_bytes for s in inside),
            "cpu_seconds_by_role": self._cpu_by_role(t0, inside),
        }
        disks = _disk_window(inside)
        if disks:
            out["disks"] = disks
        if inside[0].gpu_busy:
            n = len(inside[0].gpu_busy)
            out["gpu_busy_mean"] = [sum(s.gpu_busy[i] for s in inside) / len(inside) for i in range(n)]
            out["gpu_busy_max"] = [max(s.gpu_busy[i] for s in inside) for i in range(n)]
            peaks: dict[int, int] = {}
            for s in inside:
                for pid, used in s.gpu_process_bytes.items():
                    peaks[pid] = max(peaks.get(pid, 0), used)
            out["gpu_memory_peak_bytes_by_pid"] = {str(pid): b for pid, b in sorted(peaks.items())}
        return out


    def _cpu_by_role(self, t0: float, inside: list[Sample]) -> dict[str, float]:
        """Core-seconds each role spent between the last sample before ``t0`` (or the first inside) and the last
        sample inside; a process started in between counts from zero."""
        before = [s for s in self.samples if s.t < t0]
        base = (before[-1] if before else inside[0]).cpu_seconds
        out: dict[str, float] = {}
        for pid, (name, seconds) in inside[-1].cpu_seconds.items():
            start = base.get(pid)
            spent = seconds - (start[1] if start else 0.0)
            if spent > 0:
                out[name] = out.get(name, 0.0) + spent
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _disks() -> dict[str, tuple[int, int, int]]:
    """Each whole disk's (read bytes, written bytes, busy milliseconds); partitions, loop and RAM devices left out
    (empty where psutil cannot read the counters)."""
    try:
        counters = psutil.disk_io_counters(perdisk=True, nowrap=True) or {}
    except (OSError, RuntimeError):
        return {}
    whole = set(os.listdir("/sys/block")) if os.path.isdir("/sys/block") else set(counters)
    out = {}
    for name, c in counters.items():
        if name not in whole or name.startswith(("loop", "ram", "zram", "sr")):
            continue
        out[name] = (int(c.read_bytes), int(c.write_bytes), int(getattr(c, "busy_time", 0)))
    return out


def _disk_window(inside: list[Sample]) -> dict[str, dict[str, float]]:
    """Per disk that moved data between the first and last sample: busy fraction (the kernel's io_ticks: time with
    a request in flight), MB read and written per second."""
    first, last = inside[0], inside[-1]
    span = last.t - first.t
    out: dict[str, dict[str, float]] = {}
    for name, (read, written, busy) in last.disks.items():
        if name not in first.disks or span <= 0:
            continue
        r0, w0, b0 = first.disks[name]
        if read == r0 and written == w0:
            continue
        out[name] = {"busy": min(1.0, (busy - b0) / 1000.0 / span), "read_mb_s": (read - r0) / 1e6 / span,
                     "write_mb_s": (written - w0) / 1e6 / span}
    return out


def cpu_summary(window: dict[str, Any], frames: int) -> str:
    """One line: core-seconds per frame by role (the largest first), from a window's ``cpu_seconds_by_role``."""
    roles = window.get("cpu_seconds_by_role") or {}
    if not roles or frames <= 0:
        return "no CPU breakdown"
    total = sum(roles.values())
    return f"CPU core-s per frame {total / frames:.2f}: " + ", ".join(
        f"{name} {seconds / frames:.2f}" for name, seconds in roles.items() if seconds / frames >= 0.01)


def busy_summary(window: dict[str, Any]) -> str:
    """One line for the table: GPU busy (mean per GPU), CPU busy (mean), peaks."""
    if not window:
        return "no samples"
    parts = []
    if "gpu_busy_mean" in window:
        parts.append("GPU busy " + "/".join(f"{b:.0%}" for b in window["gpu_busy_mean"]))
        peak = max(window["gpu_memory_peak_bytes_by_pid"].values(), default=0)
        parts.append(f"GPU mem peak/worker {peak / 2**30:.1f} GiB")
    parts.append(f"CPU busy {window['cpu_busy_mean']:.0%}")
    disks = window.get("disks") or {}
    if disks:  # the busiest disk: a batch that writes faster than it can sync waits here
        name, d = max(disks.items(), key=lambda kv: kv[1]["busy"])
        parts.append(f"disk {name} busy {d['busy']:.0%} (write {d['write_mb_s']:.0f} MB/s)")
    parts.append(f"host mem peak {window['host_used_peak_bytes'] / 2**30:.1f} GiB")
    return ", ".join(parts)
