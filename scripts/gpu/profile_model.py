"""GPU: where the model pass's time goes, kernel by kernel, and what a few cheap changes would buy.

python3 scripts/gpu/profile_model.py --json OUT/model-profile.json [--height 10304 --width 7728]
- enhance time per package (v1, v2) and precision (float16, bfloat16) on an 80 MP and a 50 MP frame;
- torch.profiler's CUDA-time table of the default (v2, float16) pass: convolutions against element-wise work;
- variants of the network's forward on the same canvas (the service's code is not changed by this script):
  as shipped; ReLU and the residual add in place; cuDNN's autotuner on (benchmark=True) and whether it changes
  the output's bits; channels-first instead of channels-last.
Prints tables, writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lab.bench.enhance import _timed, make_inputs
from services.pipeline.models import jdd
from services.pipeline.models.registry import load_enhancer


def enhance_times(dev: str, sizes: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    rows = []
    for label, (h, w) in sizes.items():
        data = make_inputs(h, w, dev)
        for package in ("strata_jdd_v1.strata", "strata_jdd_v2.strata"):
            for precision in ("float16", "bfloat16"):
                enh = load_enhancer("IQ3_S", dev, package=package, precision=precision)
                t = _timed(lambda e=enh, d=data: e.enhance(d.mosaic, "RGGB", d.shot, d.read), dev, 5)
                rows.append({"size": label, "package": package, "precision": precision,
                             "median_s": float(np.median(t)), "min_s": float(min(t))})
                print(f"{label:<6} {package:<22} {precision:<9} enhance median {np.median(t):.4f} s", flush=True)
        del data
        torch.cuda.empty_cache()
    return rows


def kernel_table(dev: str, h: int, w: int) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    data = make_inputs(h, w, dev)
    enh = load_enhancer("IQ3_S", dev, package="strata_jdd_v2.strata", precision="float16")
    enh.enhance(data.mosaic, "RGGB", data.shot, data.read)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            enh.enhance(data.mosaic, "RGGB", data.shot, data.read)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.self_device_time_total for e in events) or 1.0
    rows = []
    print(f"{'kernel / op':<90} {'ms/pass':>8} {'share':>6} {'calls':>6}")
    for e in events[:25]:
        if e.self_device_time_total <= 0:
            continue
        ms = e.self_device_time_total / 2 / 1000
        rows.append({"name": e.key[:160], "ms_per_pass": ms, "share": e.self_device_time_total / total,
                     "calls_per_pass": e.count / 2})
        print(f"{e.key[:90]:<90} {ms:8.2f} {e.self_device_time_total / total:6.1%} {e.count / 2:6.0f}")
    print(f"total device time per pass {total / 2 / 1000:.1f} ms", flush=True)
    return rows


def forward_inplace(net: jdd.JDDNet, packed: Tensor, noise: Tensor) -> Tensor:
    x = torch.cat([packed, noise * jdd.NOISE_SCALE], dim=1)
    x = F.relu_(net.head(x))
    for block in net.blocks:
        c = 2 * block.dilation
        y = block.conv2(F.relu_(block.conv1(x)))
        x = y.add_(x[..., c:-c, c:-c])
    return net.tail(x)


class Folded:
    """The network with every conv2's bias folded into the convolutions after it (a per-channel constant added to
    a valid convolution's input is a constant on its output), head and conv1 with bias and ReLU fused into cuDNN's
    call: per block one convolution + ReLU, one plain convolution, one residual add."""

    def __init__(self, net: jdd.JDDNet, dtype: torch.dtype, fused: bool) -> None:
        self.fused, self.dtype = fused, dtype
        carried = torch.zeros(net.head.out_channels, dtype=torch.float64, device=net.head.weight.device)
        self.layers = []
        for block in net.blocks:
            w1 = block.conv1.weight.double()
            b1 = block.conv1.bias.double() + w1.sum((2, 3)) @ carried  # type: ignore[union-attr]
            self.layers.append((block.dilation, w1.to(dtype), b1.to(dtype), block.conv2.weight.to(dtype)))
            carried = carried + block.conv2.bias.double()  # type: ignore[union-attr]
        wt = net.tail.weight.double()
        self.tail = (wt.to(dtype), (net.tail.bias.double() + wt.sum((2, 3)) @ carried).to(dtype))  # type: ignore[union-attr]
        self.head = (net.head.weight.to(dtype), net.head.bias.to(dtype))  # type: ignore[union-attr]
        if dtype != torch.float32:
            self.layers = [(d, a.to(memory_format=torch.channels_last), b, c.to(memory_format=torch.channels_last))
                           for d, a, b, c in self.layers]

    def _conv_relu(self, x: Tensor, w: Tensor, b: Tensor, d: int) -> Tensor:
        if self.fused:
            return torch.cudnn_convolution_relu(x, w, b, [1, 1], [0, 0], [d, d], 1)
        return F.relu(F.conv2d(x, w, b, dilation=d))

    def __call__(self, packed: Tensor, noise: Tensor) -> Tensor:
        x = torch.cat([packed, noise * jdd.NOISE_SCALE], dim=1).to(self.dtype)
        x = self._conv_relu(x, *self.head, 1)
        for d, w1, b1, w2 in self.layers:
            y = F.conv2d(self._conv_relu(x, w1, b1, d), w2, None, dilation=d)
            x = y.add_(x[..., 2 * d : -2 * d, 2 * d : -2 * d])
        return F.conv2d(x, *self.tail)


def compiled_variant(net: Any, run: Any, dev: str, add: Any) -> None:
    import time

    compiled = torch.compile(net)
    t0 = time.perf_counter()
    run(compiled)
    torch.cuda.synchronize()
    print(f"torch.compile first call {time.perf_counter() - t0:.1f} s", flush=True)
    add("torch.compile (inductor, default)", lambda: run(compiled))


def forward_variants(dev: str, h: int, w: int) -> list[dict[str, Any]]:
    """The network alone on one canvas, float16 autocast, each variant timed; outputs compared with the shipped."""
    data = make_inputs(h, w, dev)
    enh = load_enhancer("IQ3_S", dev, package="strata_jdd_v2.strata", precision="float16")
    net = enh.net  # type: ignore[attr-defined]
    canvas = F.pad(data.mosaic, (122, 122, 122, 122), mode="reflect").contiguous(memory_format=torch.channels_last)
    packed = jdd.pack_rggb(canvas)
    noise = jdd.noise_std_maps(packed, data.shot, data.read)

    def run(fwd: Any, cl: bool = True) -> Tensor:
        p, n = (packed, noise) if cl else (packed.contiguous(), noise.contiguous())
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            return fwd(p, n)

    shipped = run(net)
    rows = []

    def add(name: str, fn: Any) -> None:
        t = _timed(fn, dev, 5)
        out = fn()
        same = bool(torch.equal(out, shipped))
        diff = float((out.float() - shipped.float()).abs().max())
        rows.append({"variant": name, "median_s": float(np.median(t)), "bit_identical": same, "max_abs_diff": diff})
        print(f"{name:<40} net median {np.median(t):.4f} s  identical {same}  max diff {diff:.3g}", flush=True)

    add("shipped (channels-last, autocast fp16)", lambda: run(net))
    for full in (False, True):
        f = jdd.FoldedJDD(net, torch.float16, fused=True, width=64, full_width=full)
        add(f"FoldedJDD, full_width={full}", lambda f=f: f(packed, noise))
    if QUICK:
        return rows
    add("ReLU and residual add in place", lambda: run(lambda p, n: forward_inplace(net, p, n)))
    torch.backends.cudnn.benchmark = True
    add("cudnn.benchmark=True", lambda: run(net))
    torch.backends.cudnn.benchmark = False
    net_cf = jdd.JDDNet(64, (1, 1, 2, 3, 3, 2, 1, 1)).to(dev).eval()
    net_cf.load_state_dict(net.state_dict())
    add("channels-first", lambda: run(net_cf, cl=False))
    half = jdd.JDDNet(64, (1, 1, 2, 3, 3, 2, 1, 1)).to(dev).eval()
    half.load_state_dict(net.state_dict())
    half = half.half().to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    ph, nh = packed.half(), noise.half()
    add("weights in float16, no autocast", lambda: half(ph, nh))
    folded = Folded(net, torch.float16, fused=True)
    add("conv2 biases folded, cuDNN conv+bias+ReLU", lambda: folded(packed, noise))
    unfused = Folded(net, torch.float16, fused=False)
    add("conv2 biases folded, ReLU apart", lambda: unfused(packed, noise))
    try:
        compiled_variant(net, run, dev, add)
    except Exception as exc:  # noqa: BLE001 - a measurement: report and go on
        print(f"torch.compile failed: {exc!r}"[:400], flush=True)
    return rows


def width_variants(dev: str, h: int, w: int) -> list[dict[str, Any]]:
    """v1 (48 channels) folded in float16, its hidden width as is and padded with zero channels."""
    data = make_inputs(h, w, dev)
    net = load_enhancer("IQ3_S", dev, package="strata_jdd_v1.strata", precision="float16").net  # type: ignore[attr-defined]
    canvas = F.pad(data.mosaic, (80, 80, 80, 80), mode="reflect").contiguous(memory_format=torch.channels_last)
    packed = jdd.pack_rggb(canvas)
    noise = jdd.noise_std_maps(packed, data.shot, data.read)
    rows = []
    for width in (48, 64, 96):
        folded = jdd.FoldedJDD(net, torch.float16, fused=True, width=width)
        t = _timed(lambda f=folded: f(packed, noise), dev, 5)
        rows.append({"package": "strata_jdd_v1", "width": width, "median_s": float(np.median(t))})
        print(f"v1 folded float16, hidden width {width}: net median {np.median(t):.4f} s", flush=True)
    return rows


QUICK = False


def main() -> None:
    global QUICK
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the slower forward variants and v1's widths")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--height", type=int, default=10304)
    ap.add_argument("--width", type=int, default=7728)
    args = ap.parse_args()
    QUICK = args.quick
    dev = "cuda:0"
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    out["enhance"] = enhance_times(dev, {"80 MP": (args.height, args.width), "50 MP": (7296, 6912)})
    out["kernels"] = kernel_table(dev, args.height, args.width)
    with torch.inference_mode():
        out["forward_variants"] = forward_variants(dev, args.height, args.width)
        if not QUICK:
            out["v1_widths"] = width_variants(dev, args.height, args.width)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
