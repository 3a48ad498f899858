"""GPU probe of a stack frame's warp (run on the GPU host): seconds per 50 MP frame render (3 x 7296 x 6912, the
IQ2_XS frame) for ``bicubic``, ``lanczos3``, ``lanczos4`` and ``lanczos5`` (the separable kernels) under a smooth
sub-pixel flow, and the separable Lanczos-3 kernel's largest difference from the 6 x 6 product kernel (the unit
tests' reference) on a crop.

    python3 scripts/gpu/warp_probe.py --device cuda:0 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from services.pipeline.ops.align import warp
from tests.unit.test_ops_align import _lanczos_product


def smooth_flow(h: int, w: int, device: str) -> torch.Tensor:
    """A shift of (0.43, -1.37) px plus a rotation of 0.05 degree about the centre: (2, h, w)."""
    yy, xx = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32) - h / 2,
                            torch.arange(w, device=device, dtype=torch.float32) - w / 2, indexing="ij")
    a = np.deg2rad(0.05)
    return torch.stack([xx * np.sin(a) + yy * (np.cos(a) - 1) + 0.43, xx * (np.cos(a) - 1) - yy * np.sin(a) - 1.37])


def seconds(image: torch.Tensor, flow: torch.Tensor, mode: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
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
    for mode in ("bicubic", "lanczos3", "lanczos4", "lanczos5"):
        times = seconds(image, flow, mode, args.repeats)
        result[mode] = {"median_s": float(np.median(times)), "runs_s": times}
        print(f"{mode:9s} median {np.median(times):.4f} s  runs {', '.join(f'{t:.4f}' for t in times)}")
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
