"""Enhance-stage speed and GPU correctness: an 80 MP IQ3_S frame with the model resident and data on the device.

Times `Enhancer.enhance` (joint demosaic + denoise) and the whole shard render (`render_mosaic`: levels, WB,
enhance, sharpen, colour, encode) per package and precision with CUDA events after warm-up; checks on the
device that stitched strips equal the one-piece render (max LSB difference) and that bf16 stays close to fp32.
A package whose weights are not shipped yet is benchmarked with freshly initialised weights (speed does not
depend on weight values; correctness checks are structural).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from services.pipeline.models import jdd
from services.pipeline.models.registry import PACKAGES_DIR, load_enhancer
from services.pipeline.render import RenderParams, render_mosaic, render_strip

IQ3S_H, IQ3S_W = 10304, 7728


def _timed(fn, device: str, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    fn()  # warm-up (kernel selection, allocator)
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def _untrained_package(tmp: Path) -> Path:
    """A jdd package with initialised weights, for speed measurement before training has run."""
    from services.pipeline.models.package import write_package
    from training.packages import jdd_manifest

    config = {"width": 48, "dilations": [1, 1, 2, 2, 1, 1]}
    net = jdd.JDDNet(48, (1, 1, 2, 2, 1, 1))
    path = tmp / "untrained_jdd.strata"
    write_package(path, jdd_manifest("untrained_jdd", ("*",), config, {"note": "speed benchmark only"}),
                  {k: v.detach() for k, v in net.state_dict().items()})
    return path


def params_for(package: str) -> RenderParams:
    return RenderParams(cfa="RGGB", black=(1024.0,) * 4, white=65535.0, gains=(1.9, 1.0, 1.4),
                        rgb_cam=((1.6, -0.5, -0.1), (-0.2, 1.4, -0.2), (0.0, -0.4, 1.4)),
                        noise_shot=2e-3, noise_read=4e-6, model=package)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--packages", default="classical_v1.strata,strata_jdd_v1.strata")
    ap.add_argument("--json", type=Path, default=Path("bench-enhance.json"))
    ap.add_argument("--tmp", type=Path, default=Path("/tmp"))
    args = ap.parse_args(argv)
    dev = args.device
    from services.pipeline.models.package import configure_cuda_numerics
    h, w = int(IQ3S_H * args.scale) // 2 * 2, int(IQ3S_W * args.scale) // 2 * 2
    g = torch.Generator(device="cpu").manual_seed(0)
    mosaic = (torch.rand((1, 1, h, w), generator=g) * 0.8).to(dev)  # WB'd normalised mosaic on the device
    shot = torch.tensor([3.8e-3, 2e-3, 2.8e-3], device=dev)
    read = torch.tensor([1.4e-5, 4e-6, 8e-6], device=dev)
    raw = (1024 + np.random.default_rng(0).random((h, w)) * 50000).astype(np.uint16)
    rows = []
    for name in [p.strip() for p in args.packages.split(",") if p.strip()]:
        package = PACKAGES_DIR / name
        note = "shipped weights"
        if not package.exists():
            package, note = _untrained_package(args.tmp), "initialised weights (not yet trained)"
        # "float32+tf32": float32 activations, TF32 tensor cores in the convolutions (the GPU workers' default).
        precisions = ["float32"] + (["float32+tf32", "bfloat16"] if dev.startswith("cuda") else [])
        for precision in precisions:
            configure_cuda_numerics(precision.endswith("+tf32"))
            enhancer = load_enhancer("IQ3_S", dev, package=str(package), precision=precision.split("+")[0])
            times = _timed(lambda e=enhancer: e.enhance(mosaic, "RGGB", shot, read), dev, args.repeats)
            rows.append({"package": name, "weights": note, "precision": precision, "stage": "enhance",
                         "megapixels": h * w / 1e6, "median_s": float(np.median(times)), "min_s": min(times)})
            print(f"{name:<26} {precision:<9} enhance {h}x{w}: median {np.median(times):.4f} s "
                  f"(min {min(times):.4f}) [{note}]", flush=True)
        # Whole shard render (host uint16 in, host uint16 out), the workers' default numerics.
        configure_cuda_numerics(True)
        params = params_for(str(package))
        times = _timed(lambda p=params: render_mosaic(raw, p, device=dev), dev, max(2, args.repeats // 2))
        rows.append({"package": name, "weights": note, "precision": "default", "stage": "render_mosaic host->host",
                     "megapixels": h * w / 1e6, "median_s": float(np.median(times)), "min_s": min(times)})
        print(f"{name:<26} default   render_mosaic host->host: median {np.median(times):.4f} s", flush=True)
        # Strip exactness on this device: 4 strips vs one piece, on a 1/4-height crop, per precision.
        from services.config import get_settings

        crop = raw[: h // 4 // 2 * 2]
        cuts = [0, crop.shape[0] // 4 // 2 * 2, crop.shape[0] // 2 // 2 * 2, crop.shape[0] * 3 // 4 // 2 * 2,
                crop.shape[0]]
        for precision in precisions:
            configure_cuda_numerics(precision.endswith("+tf32"))
            get_settings().model_precision = precision.split("+")[0]
            whole = render_mosaic(crop, params, device=dev)
            stitched = np.concatenate([render_strip(crop, a, b, params, device=dev)
                                       for a, b in zip(cuts, cuts[1:], strict=False)])
            diff = np.abs(whole.astype(np.int32) - stitched.astype(np.int32))
            rows.append({"package": name, "precision": precision, "check": "strips vs whole (max, p99.99 LSB)",
                         "value": [int(diff.max()), float(np.percentile(diff, 99.99))]})
            print(f"{name:<26} {precision:<9} strips vs whole on {dev}: max diff {int(diff.max())} LSB "
                  f"(99.99th pct {np.percentile(diff, 99.99):.1f})", flush=True)
        get_settings().model_precision = None
        configure_cuda_numerics(True)
        if dev.startswith("cuda"):
            e32 = load_enhancer("IQ3_S", dev, package=str(package), precision="float32")
            e16 = load_enhancer("IQ3_S", dev, package=str(package), precision="bfloat16")
            sub = mosaic[..., :1024, :1024]
            d = (e32.enhance(sub, "RGGB", shot, read) - e16.enhance(sub, "RGGB", shot, read)).abs()
            rows.append({"package": name, "check": "bf16 vs fp32 (mean, max abs, linear)",
                         "value": [float(d.mean()), float(d.max())]})
            print(f"{name:<26} bf16 vs fp32: mean {float(d.mean()):.2e} max {float(d.max()):.2e}", flush=True)
    info = {"device": torch.cuda.get_device_name(dev) if dev.startswith("cuda") else "cpu",
            "torch": torch.__version__}
    args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
