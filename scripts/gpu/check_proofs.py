"""GPU host: a proof finished on the device (``binning.proof_from_bins``, what a worker whose strip holds the whole
image makes) against the one the writer derives on the CPU from the same bins: the codes' largest difference and
the share of codes that differ, and the time each side takes. An 80 MP frame of noisy codes by default.

Usage: python3 scripts/gpu/check_proofs.py [--device cuda:0] [--height 7728 --width 10304] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from services.export.derive import box_factor, fit_long_edge, resize_linear
from services.pipeline.binning import binned_on, proof_from_bins, quantise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--height", type=int, default=7728)
    ap.add_argument("--width", type=int, default=10304)
    ap.add_argument("--long-edge", type=int, default=1600)
    ap.add_argument("--sharpen", type=float, default=0.5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0 : a.height, 0 : a.width].astype(np.float32)
    base = (0.5 + 0.4 * np.sin(xx / 37.0) * np.cos(yy / 23.0))[..., None] * np.array([0.9, 1.0, 0.8], np.float32)
    codes = np.clip(base * 65535 + rng.normal(0, 900, (a.height, a.width, 3)), 0, 65535).astype(np.uint16)
    h, w = fit_long_edge(a.height, a.width, a.long_edge)
    k = box_factor(a.height, a.width, h, w)
    rows = torch.from_numpy(codes).to(a.device)
    out: dict[str, object] = {"device": a.device, "size": [a.height, a.width], "proof": [h, w], "k": k}
    for bits in (8, 16):
        times = []
        for _ in range(4):
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            bins = binned_on(rows, 0, k, "srgb", a.device)
            device_codes = proof_from_bins(bins, (h, w), "srgb", a.sharpen, bits)
            times.append(time.perf_counter() - t)
        host_bins = bins.cpu().numpy()
        t = time.perf_counter()
        ref = quantise(resize_linear([(0, codes)], a.long_edge, "srgb", a.sharpen, {k: [(0, host_bins)]}), bits)
        cpu_s = time.perf_counter() - t
        diff = np.abs(device_codes.astype(np.int64) - ref.astype(np.int64))
        out[f"bits{bits}"] = {"max_diff": int(diff.max()), "share_differing": float((diff > 0).mean()),
                              "device_s": round(float(np.median(times[1:])), 4), "cpu_finish_s": round(cpu_s, 4)}
        print(f"{bits}-bit proof {w}x{h}: max diff {int(diff.max())} codes, {100 * (diff > 0).mean():.3f} % differ; "
              f"bins + finish on {a.device} {np.median(times[1:]):.3f} s, the writer's finish on the CPU {cpu_s:.3f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
