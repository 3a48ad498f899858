"""Resource sampling while a benchmark runs: GPU and CPU busy fractions, GPU memory per process, host memory.

A thread samples every ``interval`` seconds: NVML (``nvidia-ml-py``, where a GPU driver exists) for each GPU's
utilisation and the memory of each process on it, psutil for the busy fraction of all cores and the host's used
memory. ``window(t0, t1)`` summarises the samples taken between two ``time.monotonic()`` stamps, so one sampler
serves every scenario of a run.
"""

from __future__ import annotations

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
                                       int(psutil.virtual_memory().used), busy, per_pid))

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
        }
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
    parts.append(f"host mem peak {window['host_used_peak_bytes'] / 2**30:.1f} GiB")
    return ", ".join(parts)
