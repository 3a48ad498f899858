"""Entry checks shared by the pipeline ops (kornia style: the error names the shape received)."""

from __future__ import annotations

import torch
from torch import Tensor


def small(values: object, device: torch.device | str | None, dtype: torch.dtype | None = None) -> Tensor:
    """A small tensor of host values (gains, black levels, kernel taps) on ``device`` without waiting for the
    device: CUDA runs a copy from pageable memory only once everything queued on the stream is done, so a plain
    ``torch.tensor(values, device=cuda)`` in the middle of a render stalls its thread until the GPU catches up
    (a third of a GPU worker's time in a batch). On a GPU the values go through pinned memory, copied
    asynchronously on the current stream (the pinned block is not reused before the copy ran)."""
    host = values.detach().to("cpu", dtype) if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if device is None or torch.device(device).type != "cuda":
        return host if device is None else host.to(device)
    if torch.compiler.is_compiling():  # traced by torch.compile: a constant of the graph (pinning has no tracer)
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def check_image(x: Tensor, channels: int, name: str = "input") -> None:
    """Raise ``TypeError``/``ValueError`` unless ``x`` is a floating (B, channels, H, W) tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(f"{name} must have shape (B, {channels}, H, W), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")


def check_min_size(x: Tensor, radius: int, name: str = "input") -> None:
    """Reflect padding by ``radius`` needs H and W greater than ``radius``."""
    h, w = x.shape[-2:]
    if h <= radius or w <= radius:
        raise ValueError(f"{name} must be larger than {radius} pixels on each side, got {tuple(x.shape)}")


def check_mosaic(x: Tensor, name: str = "mosaic", min_size: int = 8) -> None:
    """Raise ``ValueError`` unless ``x`` is an (H, W) tensor with even H and W of at least ``min_size``."""
    if not isinstance(x, Tensor) or x.ndim != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a (H, W) tensor, got {shape}")
    if x.shape[0] % 2 or x.shape[1] % 2 or min(x.shape) < min_size:
        raise ValueError(f"{name} must have even H and W of at least {min_size}, got {tuple(x.shape)}")


def as_vector(values: Tensor | float | object, like: Tensor, n: int, name: str) -> Tensor:
    """A scalar or ``n`` values (sequence, numpy or tensor) as an (n,) tensor on ``like``'s device/dtype."""
    v = (values.to(like.device, like.dtype) if isinstance(values, Tensor)
         else small(values, like.device, like.dtype)).flatten()
    if v.numel() == 1:
        v = v.expand(n)
    if v.shape != (n,):
        raise ValueError(f"{name} must be a scalar or {n} values, got shape {tuple(v.shape)}")
    return v
