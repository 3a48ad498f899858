"""Frame-group accumulators kept on the device that made them, for the stack strip that fuses them next.

A frame group's accumulator is stored (the job's durable intermediate, what another worker or a retry reads)
and, where enabled (``STRATA_RESIDENT_ACCUMULATORS``: on GPUs by default), also kept on the device. When the
stack's strip then runs in the same worker process on the same device (one GPU: the usual case), it takes the
kept tensor instead of loading the stored file and uploading it again (1 GB for 8 x 50 MP frames). One tensor per
device, the latest; a strip takes it (no second reader), a later group replaces it. The integers are the same
either way: the stored file is the kept tensor downloaded.
"""

from __future__ import annotations

import threading

import torch

from services.config import get_settings

_lock = threading.Lock()
_kept: dict[str, tuple[str, torch.Tensor]] = {}


def enabled(device: str | torch.device) -> bool:
    """Whether groups merged on ``device`` are kept: ``auto`` (the default) on CUDA devices, ``on`` everywhere."""
    mode = get_settings().resident_accumulators
    return mode == "on" or (mode == "auto" and torch.device(device).type == "cuda")


def _name(job_id: str, key: str) -> str:
    return f"{job_id}\0{key}"


def keep(device: str | torch.device, job_id: str, key: str, accumulator: torch.Tensor) -> None:
    """Keep ``accumulator`` (int32 (C, H, W) on ``device``, computed) as the group ``key`` of ``job_id``."""
    with _lock:
        _kept[str(device)] = (_name(job_id, key), accumulator)


def take(device: str | torch.device, job_id: str, key: str) -> torch.Tensor | None:
    """The kept accumulator of group ``key`` of ``job_id`` on ``device``, removed from the cache; None if another
    group (or none) is kept there. On CUDA the tensor is marked as used by the caller's stream, so its memory is not
    handed out again while that stream still reads it."""
    with _lock:
        entry = _kept.get(str(device))
        if entry is None or entry[0] != _name(job_id, key):
            return None
        del _kept[str(device)]
    tensor = entry[1]
    if tensor.is_cuda:
        tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return tensor


def clear() -> None:
    """Forget every kept tensor (tests)."""
    with _lock:
        _kept.clear()


__all__ = ["clear", "enabled", "keep", "take"]
