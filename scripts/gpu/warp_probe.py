"""GPU probe of a stack frame's warp (run on the GPU host): seconds per 50 MP frame render (3 x 7296 x 6912, the
IQ2_XS frame) for ``bicubic``, ``lanczos3``, ``lanczos4`` and ``lanczos5`` (the separable kernels, fused Triton
kernels and torch passes) under a smooth sub-pixel flow; the fused kernels against the torch passes on the whole
frame and run twice (same bits); the separable Lanczos-3 kernel's largest difference from the 6 x 6 product kernel
(the unit tests' reference) on a crop.

    python3 scripts/gpu/warp_probe.py --device cuda:0 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from services.pipeline.ops import lanczos_gpu
from services.pipeline.ops.align import LANCZOS_MODES, _warp_lanczos, warp
from tests.unit.test_ops_align import _lanczos_product


def smooth_flow(h: int, w: int, device: str) -> torch.Tensor:
    """A shift of (0.43, -1.37) px plus a rotation of 0.05 degree about the centre: (2, h, w)."""
    yy, xx = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32) - h / 2,
                            torch.arange(w, device=device, dtype=torch.float32) - w / 2, indexing="ij")
    a = np.deg2rad(0.05)
    return torch.stack([xx * np.sin(a) + yy * (np.cos(a) - 1) + 0.43, xx * (np.cos(a) - 1) - yy * np.sin(a) - 1.37])


def seconds(image: torch.Tensor, flow: torch.Tensor, mode: str, repeats: int, fused: bool = True) -> list[float]:
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mode in LANCZOS_MODES:
            _warp_lanczos(image, flow, LANCZOS_MODES[mode], fused=fused)
        else:
            warp(image, flow, mode)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times[1:]  # the first warms up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    h, w = 7296, 6912
    image = torch.rand(3, h, w, device=args.device, generator=torch.Generator(args.device).manual_seed(0))
    flow = smooth_flow(h, w, args.device)
    result: dict[str, object] = {"device": torch.cuda.get_device_name(args.device), "frame": [3, h, w]}
    print(f"fused kernels (Triton): {lanczos_gpu.available(image)}")
    for mode in ("bicubic", "lanczos3", "lanczos4", "lanczos5"):
        for fused in (True, False) if mode in LANCZOS_MODES else (True,):
            name = mode if fused else f"{mode} (torch passes)"
            times = seconds(image, flow, mode, args.repeats, fused)
            result[name] = {"median_s": float(np.median(times)), "runs_s": times}
            print(f"{name:24s} median {np.median(times):.4f} s  runs {', '.join(f'{t:.4f}' for t in times)}")
        if mode in LANCZOS_MODES:  # the fused kernels against the torch passes, the whole frame
            a = LANCZOS_MODES[mode]
            first = _warp_lanczos(image, flow, a)
            diff = (first - _warp_lanczos(image, flow, a, fused=False)).abs()
            again = bool(torch.equal(first, _warp_lanczos(image, flow, a)))
            worst, mean = float(diff.max()), float(diff.mean())
            result[f"{mode} fused vs torch"] = {"max": worst, "mean": mean, "repeatable": again}
            print(f"{mode}: fused vs torch passes max {worst:.2e} mean {mean:.2e}; same bits twice: {again}")
            del first, diff
    crop, crop_flow = image[:, :512, :512].cpu(), flow[:, :512, :512].cpu()
    diff = (warp(image[:, :512, :512], flow[:, :512, :512], "lanczos3")[0].cpu() - _lanczos_product(crop, crop_flow))
    inner = diff[:, 8:-8, 8:-8].abs()
    result["vs_product_kernel"] = {"max": float(inner.max()), "mean": float(inner.mean())}
    print(f"separable vs product kernel on a 512 x 512 crop: max {inner.max():.2e}, mean {inner.mean():.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
