"""The separable Lanczos warp's two passes as fused Triton kernels (CUDA only; :func:`align._warp_lanczos` falls back
to its torch passes on the CPU or where Triton is missing).

The torch passes read and write whole planes once per tap (2a taps, a few element-wise operations each: about 0.1 s
for a 50 MP frame's Lanczos-5 on an H100, where bicubic ``grid_sample`` takes 7 ms). Here one program computes a
block of output pixels of one row, every channel: the position, its weights and the 2a taps stay in registers, so
each pass reads its taps (neighbours, cached) and writes the output once. Same arithmetic as the torch passes
(float32, the weights normalised by their sum, the taps next to the position exact where it falls on a sample), so
the two agree to float rounding (at most 7e-7 on a 50 MP frame, H100), and one device gives the same bits for a
pixel whatever block or strip computes it.

Tests run the kernels through Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, where Triton is installed);
``scripts/gpu/warp_probe.py`` checks them against the torch passes and times them on a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import math

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch; CPU builds (CI, the VM) run the torch passes instead
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

_BLOCK = 256  # output pixels of one row per program
log = logging.getLogger(__name__)
_broken: str | None = None  # why the kernels failed in this process (then the torch passes run)


def available(image: Tensor) -> bool:
    """Whether :func:`warp_lanczos` can run on ``image``'s device: a CUDA tensor, Triton importable and its kernels
    not found broken in this process (:func:`disable`)."""
    return triton is not None and image.is_cuda and _broken is None


def disable(exc: BaseException) -> None:
    """The kernels failed to build or launch (Triton compiles a small C launcher at first use, so a host without a C
    compiler cannot run them): say so once; :func:`available` is false from now on in this process."""
    global _broken
    if _broken is None:
        _broken = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("the fused Lanczos warp kernels cannot run here (%s); the stack warp runs as torch operations "
                    "(same results to float rounding, about 12x slower on the GPU; docs/OPERATIONS.md)", _broken)


if triton is not None:

    @triton.jit
    def _pass_kernel(src, dst, fy, fx, H, W, C: tl.constexpr, CP: tl.constexpr, A: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """One pass of :func:`align._warp_lanczos`: ``ROWS`` true interpolates along each row (at ``x + fx`` read
        ``round(fy)`` rows up, as the torch row pass does), false down each column (at ``y + fy``)."""
        r = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
        inside = cols < W
        chans = tl.arange(0, CP)  # (CP,)
        plane = chans.to(tl.int64)[:, None] * H * W  # (CP, 1)
        cmask = (chans < C)[:, None] & inside[None, :]  # (CP, BLOCK)
        flow_at = r.to(tl.int64) * W + cols
        vy = tl.load(fy + flow_at, mask=inside, other=0.0)
        if ROWS:
            # torch.round: half to even
            low = tl.floor(vy)
            d = vy - low
            half_up = (low - 2.0 * tl.floor(low * 0.5)) == 1.0  # low odd: a half goes up to the even neighbour
            rounded = tl.where(d > 0.5, low + 1.0, tl.where(d < 0.5, low, tl.where(half_up, low + 1.0, low)))
            reader = tl.minimum(tl.maximum(r - rounded.to(tl.int32), 0), H - 1)
            pos = cols.to(tl.float32) + tl.load(fx + reader.to(tl.int64) * W + cols, mask=inside, other=0.0)
            size = W
        else:
            pos = r.to(tl.float32) + vy
            size = H
        base_f = tl.floor(pos)
        frac = pos - base_f
        base = base_f.to(tl.int32)
        sin_f = A * tl.sin(3.141592653589793 * frac)
        acc = tl.zeros((CP, BLOCK), dtype=tl.float32)
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in tl.static_range(2 * A):
            t = i + 1 - A
            x = 3.141592653589793 * (frac - t)
            if t % 2 == 0:  # sin(pi (f - t)) = (-1)^t sin(pi f)
                k = sin_f * tl.sin(x / A) / tl.maximum(x * x, 1e-12)
            else:
                k = -sin_f * tl.sin(x / A) / tl.maximum(x * x, 1e-12)
            if t >= 0 and t <= 1:  # the taps next to the position: x may vanish
                k = tl.where(tl.abs(x) < 1e-6, 1.0, k)
            total += k
            index = tl.minimum(tl.maximum(base + t, 0), size - 1).to(tl.int64)
            if ROWS:
                at = plane + r.to(tl.int64) * W + index[None, :]
            else:
                at = plane + index[None, :] * W + cols[None, :]
            acc += k[None, :] * tl.load(src + at, mask=cmask, other=0.0)
        tl.store(dst + plane + r.to(tl.int64) * W + cols[None, :], acc / total[None, :], mask=cmask)


def warp_lanczos(image: Tensor, fy: Tensor, fx: Tensor, a: int) -> Tensor:
    """The separable Lanczos-``a`` warp of (C, H, W) ``image`` by the flow (``fy``, ``fx``), each (H, W): (C, H, W)
    float32, as :func:`align._warp_lanczos`'s torch passes compute it. Needs Triton (CUDA, or its interpreter)."""
    if triton is None:  # pragma: no cover - callers check available()
        raise RuntimeError("the fused Lanczos warp needs Triton")
    c, h, w = image.shape
    src = image.to(torch.float32).contiguous()
    fy, fx = fy.to(torch.float32).contiguous(), fx.to(torch.float32).contiguous()
    across = torch.empty_like(src)
    out = torch.empty_like(src)
    grid = (h, math.ceil(w / _BLOCK))
    cp = triton.next_power_of_2(c)
    with torch.cuda.device(src.device) if src.is_cuda else contextlib.nullcontext():  # launches on the current one
        _pass_kernel[grid](src, across, fy, fx, h, w, C=c, CP=cp, A=a, ROWS=True, BLOCK=_BLOCK)
        _pass_kernel[grid](across, out, fy, fx, h, w, C=c, CP=cp, A=a, ROWS=False, BLOCK=_BLOCK)
    return out
