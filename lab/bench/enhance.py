"""Enhance-stage speed and GPU correctness: an 80 MP IQ3_S frame with the model resident and data on the device.

Times `Enhancer.enhance` (joint demosaic + denoise) and the whole shard render (`render_mosaic`: levels, WB,
enhance, sharpen, colour, encode) per package and precision with CUDA events after warm-up; checks on the
device that stitched strips equal the one-piece render (max LSB difference) and that bf16 stays close to fp32
(float16, the GPU default: ``scripts/gpu/model_precision.py`` compares it on full frames).
A package whose weights are not shipped yet is benchmarked with freshly initialised weights (speed does not
depend on weight values; correctness checks are structural).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.args import positive_float, torch_device
from services.pipeline.models import jdd
from services.pipeline.models.package import configure_cuda_numerics
from services.pipeline.models.registry import PACKAGES_DIR, compute_precision, load_enhancer
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

    config = {"width": 48, "dilations": [1, 1, 2, 2, 1, 1]}
    net = jdd.JDDNet(48, (1, 1, 2, 2, 1, 1))
    path = tmp / "untrained_jdd.strata"
    write_package(path, jdd.jdd_manifest("untrained_jdd", ("*",), config, {"note": "speed benchmark only"}),
                  {k: v.detach() for k, v in net.state_dict().items()})
    return path


def params_for(package: str) -> RenderParams:
    return RenderParams(cfa="RGGB", black=(1024.0,) * 4, white=65535.0, gains=(1.9, 1.0, 1.4),
                        rgb_cam=((1.6, -0.5, -0.1), (-0.2, 1.4, -0.2), (0.0, -0.4, 1.4)),
                        noise_shot=2e-3, noise_read=4e-6, model=package)


@dataclass(frozen=True)
class Inputs:
    """The benchmark's data: a WB'd normalised mosaic and its noise on the device, and a host raw frame."""

    mosaic: torch.Tensor
    shot: torch.Tensor
    read: torch.Tensor
    raw: np.ndarray

    @property
    def megapixels(self) -> float:
        return self.raw.shape[0] * self.raw.shape[1] / 1e6


def make_inputs(h: int, w: int, dev: str) -> Inputs:
    g = torch.Generator(device="cpu").manual_seed(0)
    mosaic = (torch.rand((1, 1, h, w), generator=g) * 0.8).to(dev)  # WB'd normalised mosaic on the device
    shot = torch.tensor([3.8e-3, 2e-3, 2.8e-3], device=dev)
    read = torch.tensor([1.4e-5, 4e-6, 8e-6], device=dev)
    raw = (1024 + np.random.default_rng(0).random((h, w)) * 50000).astype(np.uint16)
    return Inputs(mosaic, shot, read, raw)


def bench_enhance(name: str, package: Path, note: str, precisions: list[str], data: Inputs, dev: str,
                  repeats: int, orientations: int = 1) -> list[dict[str, Any]]:
    """``Enhancer.enhance`` alone, per precision, the model resident and the data on the device."""
    rows = []
    h, w = data.raw.shape
    for precision in precisions:
        configure_cuda_numerics(precision.endswith("+tf32"))
        enhancer = load_enhancer("IQ3_S", dev, package=str(package), precision=precision.split("+")[0])
        times = _timed(lambda e=enhancer: e.enhance(data.mosaic, "RGGB", data.shot, data.read, orientations), dev,
                       repeats)
        rows.append({"package": name, "weights": note, "precision": precision, "stage": "enhance",
                     "megapixels": data.megapixels, "median_s": float(np.median(times)), "min_s": min(times)})
        print(f"{name:<26} {precision:<9} enhance {h}x{w}: median {np.median(times):.4f} s "
              f"(min {min(times):.4f}) [{note}]", flush=True)
    return rows


def bench_render(name: str, note: str, params: RenderParams, data: Inputs, dev: str,
                 repeats: int) -> dict[str, Any]:
    """The whole shard render (host uint16 in, host uint16 out) with the workers' default numerics."""
    configure_cuda_numerics(True)
    times = _timed(lambda p=params: render_mosaic(data.raw, p, device=dev), dev, max(2, repeats // 2))
    print(f"{name:<26} default   render_mosaic host->host: median {np.median(times):.4f} s", flush=True)
    return {"package": name, "weights": note, "precision": "default", "stage": "render_mosaic host->host",
            "megapixels": data.megapixels, "median_s": float(np.median(times)), "min_s": min(times)}


def check_strips(name: str, params: RenderParams, raw: np.ndarray, precisions: list[str],
                 dev: str) -> list[dict[str, Any]]:
    """Strip exactness on this device: 4 strips vs one piece, on a 1/4-height crop, per precision."""
    rows = []
    crop = raw[: raw.shape[0] // 4 // 2 * 2]
    cuts = [0, crop.shape[0] // 4 // 2 * 2, crop.shape[0] // 2 // 2 * 2, crop.shape[0] * 3 // 4 // 2 * 2,
            crop.shape[0]]
    for precision in precisions:
        configure_cuda_numerics(precision.endswith("+tf32"))
        with compute_precision(precision.split("+")[0]):
            whole = render_mosaic(crop, params, device=dev)
            stitched = np.concatenate([render_strip(crop, a, b, params, device=dev)
                                       for a, b in zip(cuts, cuts[1:], strict=False)])
        diff = np.abs(whole.astype(np.int32) - stitched.astype(np.int32))
        rows.append({"package": name, "precision": precision, "check": "strips vs whole (max, p99.99 LSB)",
                     "value": [int(diff.max()), float(np.percentile(diff, 99.99))]})
        print(f"{name:<26} {precision:<9} strips vs whole on {dev}: max diff {int(diff.max())} LSB "
              f"(99.99th pct {np.percentile(diff, 99.99):.1f})", flush=True)
    configure_cuda_numerics(True)
    return rows


def check_bf16(name: str, package: Path, data: Inputs, dev: str) -> dict[str, Any]:
    """bf16 against fp32 enhancement on a 1024 x 1024 crop (linear values)."""
    e32 = load_enhancer("IQ3_S", dev, package=str(package), precision="float32")
    e16 = load_enhancer("IQ3_S", dev, package=str(package), precision="bfloat16")
    sub = data.mosaic[..., :1024, :1024]
    d = (e32.enhance(sub, "RGGB", data.shot, data.read) - e16.enhance(sub, "RGGB", data.shot, data.read)).abs()
    print(f"{name:<26} bf16 vs fp32: mean {float(d.mean()):.2e} max {float(d.max()):.2e}", flush=True)
    return {"package": name, "check": "bf16 vs fp32 (mean, max abs, linear)",
            "value": [float(d.mean()), float(d.max())]}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="strata bench enhance", description=__doc__)
    ap.add_argument("--device", type=torch_device, default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", type=positive_float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--packages", default="classical_v1.strata,strata_jdd_v1.strata")
    ap.add_argument("--json", type=Path, default=Path("bench-enhance.json"))
    ap.add_argument("--tmp", type=Path, default=Path("/tmp"))
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    dev = args.device
    h, w = int(IQ3S_H * args.scale) // 2 * 2, int(IQ3S_W * args.scale) // 2 * 2
    data = make_inputs(h, w, dev)
    rows: list[dict[str, Any]] = []
    for name in [p.strip() for p in args.packages.split(",") if p.strip()]:
        file, _, count = name.partition("@")  # NAME@N: a self-ensemble of N orientations (the max tier: @4)
        orientations = int(count) if count else 1
        package = PACKAGES_DIR / file
        note = "shipped weights"
        if not package.exists():
            package, note = _untrained_package(args.tmp), "initialised weights (not yet trained)"
        # "float32+tf32": float32 activations, TF32 tensor cores (the exact reference; float16 is the GPU default).
        precisions = ["float32"] + (["float32+tf32", "float16", "bfloat16"] if dev.startswith("cuda") else [])
        rows += bench_enhance(name, package, note, precisions, data, dev, args.repeats, orientations)
        params = replace(params_for(str(package)), orientations=orientations)
        rows.append(bench_render(name, note, params, data, dev, args.repeats))
        rows += check_strips(name, params, data.raw, precisions, dev)
        if dev.startswith("cuda"):
            rows.append(check_bf16(name, package, data, dev))
    info = {"device": torch.cuda.get_device_name(dev) if dev.startswith("cuda") else "cpu",
            "torch": torch.__version__}
    args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
