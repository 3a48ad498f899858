"""Would torch.compile (Inductor) pay for a stack frame's non-model work? Eager against compiled, one 50 MP frame.

python3 scripts/gpu/compile_probe.py --device cuda:0 [--scale 1.0 --json OUT.json]

Times, on a reference and one frame shifted by a sub-pixel amount (the frame already demosaiced, as in
``ops.merge._add_aligned``): the alignment (``align_frame``), and the rest (dense flow, warp, motion weights,
fixed-point accumulation, the Bayer planes' warp), each eager and through ``torch.compile`` (first call = compile
time, then the warm median of 5), the first call of another job's parameters (compiled again or not), and how far the
compiled results are from the eager ones. Also two eager
rewrites: the motion test's 7 x 7 box mean as two 1-D pools, and the alignment's blur. The service is not changed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lab.bench.pipeline import _decode_all, procedural_mosaic, write_frame
from services.pipeline.ops import align as al
from services.pipeline.ops.cfa import join_sites, split_sites
from services.pipeline.ops.merge import _fixed, demosaic_camera, motion_weights, prepare_reference
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import _normalised, frame_shifts, merge_params, stack_params

RESULTS: dict[str, Any] = {}


def timed(name: str, fn: Callable[[], Any], dev: torch.device, runs: int = 5) -> Any:
    def once() -> tuple[float, Any]:
        torch.cuda.synchronize(dev) if dev.type == "cuda" else None
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(dev) if dev.type == "cuda" else None
        return time.perf_counter() - t0, out

    first, out = once()
    warm = [once()[0] for _ in range(runs)]
    RESULTS[name] = {"first_s": first, "warm_median_s": statistics.median(warm)}
    print(f"{name:<52} first {first:8.3f} s   warm {statistics.median(warm) * 1e3:8.2f} ms", flush=True)
    return out


def post(acc: torch.Tensor, ref_rgb: torch.Tensor, level: torch.Tensor, spread: torch.Tensor, rgb: torch.Tensor,
         frame: torch.Tensor, flow: torch.Tensor, mp: Any) -> torch.Tensor:
    """``_add_aligned`` after the alignment (into a copy of ``acc``)."""
    acc = acc.clone()
    h, w = frame.shape
    pixels = al.tiles_to_pixels(flow, mp.align.tile_size, (h, w))
    moved, valid = al.warp(rgb, pixels, mode="bicubic")
    weight = motion_weights(ref_rgb, moved, valid.expand(3, h, w), mp, level=level, spread=spread) * valid
    acc[:3] += _fixed(moved * weight)
    acc[3] += _fixed(weight)
    bayer = join_sites(al.warp(split_sites(frame), pixels[:, ::2, ::2] / 2.0, mode="bicubic")[0])
    acc[4] += _fixed(bayer * weight)
    return acc


def compiled(ref: Any, grey: torch.Tensor, rgb: torch.Tensor, frame: torch.Tensor, prior: tuple[float, float],
             flow_e: torch.Tensor, acc_e: torch.Tensor, mp: Any, dev: torch.device) -> None:
    """The alignment and the rest through torch.compile in two modes, against the eager results."""
    h, w = frame.shape
    acc0 = torch.zeros(5, h, w, dtype=torch.int64, device=dev)
    for mode in ("default", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        try:
            calign = torch.compile(al.align_frame, mode=mode)
            flow_c = timed(f"align_frame, compiled {mode}", partial(calign, ref.pyramid, grey, mp.align, prior), dev)
            cpost = torch.compile(post, mode=mode)
            acc_c = timed(f"rest, compiled {mode}",
                          partial(cpost, acc0, ref.rgb, ref.level, ref.spread, rgb, frame, flow_e, mp), dev)
            # another job: new parameters (another noise level, a new model closure) and a prior elsewhere; does
            # the compiled code serve it or compile again (its first call's time says)?
            other = replace(mp, shot=mp.shot * 1.7, read=mp.read * 0.6, demosaic=lambda b, c: b)
            timed(f"align_frame, compiled {mode}, another job", partial(calign, ref.pyramid, grey, other.align,
                                                                        (prior[0] + 0.3, prior[1] - 0.2)), dev, 1)
            timed(f"rest, compiled {mode}, another job",
                  partial(cpost, acc0, ref.rgb, ref.level, ref.spread, rgb, frame, flow_e, other), dev, 1)
            RESULTS[f"{mode}_flow_max_abs"] = float((flow_c - flow_e).abs().max())
            RESULTS[f"{mode}_acc_max_abs"] = int((acc_c - acc_e).abs().max())
            RESULTS[f"{mode}_acc_equal"] = bool(torch.equal(acc_c, acc_e))
            print(f"  flow max |compiled - eager| {RESULTS[f'{mode}_flow_max_abs']:.2e} px; accumulator max "
                  f"{RESULTS[f'{mode}_acc_max_abs']} (of 2^20 a unit), equal {RESULTS[f'{mode}_acc_equal']}")
        except Exception as exc:  # report, go on
            print(f"compile {mode} failed: {type(exc).__name__}: {str(exc)[:400]}")
            RESULTS[f"{mode}_error"] = repr(exc)[:1000]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dev = torch.device(args.device)
    h, w = int(7296 * args.scale) // 2 * 2, int(6912 * args.scale) // 2 * 2
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for k, shift in enumerate([(0.0, 0.0), (0.37, -0.81)]):
            p = Path(d) / f"f{k}.dng"
            write_frame(p, procedural_mosaic(h, w, 7, shift), "IQ2_XS")  # type: ignore[arg-type]
            paths.append(p)
        mosaics, metas = _decode_all(paths, Path(d))
    frames = list(zip(mosaics, metas, strict=True))
    shifts = frame_shifts(frames[0], frames)
    params = stack_params(shot_render_params(metas[0], mosaics[0]), 8, shifts + [(0.0, 0.0)] * 6)
    print(f"{w}x{h} on {dev}, torch {torch.__version__}", flush=True)
    try:
        import triton  # noqa: F401

        print(f"triton {triton.__version__}")
    except ImportError:
        print("no triton")
    with torch.inference_mode():
        mp = merge_params(params, dev, 8)
        ref = prepare_reference(_normalised(mosaics[0], metas[0], dev, clip_black=False), mp)
        frame = _normalised(mosaics[1], metas[1], dev, clip_black=False)
        rgb = demosaic_camera(frame.clamp(min=0.0), mp, 1)
        grey = rgb.mean(dim=0)
        prior = shifts[1]
        flow_e = timed("align_frame, eager", lambda: al.align_frame(ref.pyramid, grey, mp.align, prior), dev)
        acc0 = torch.zeros(5, h, w, dtype=torch.int64, device=dev)
        acc_e = timed("rest (warp, motion, accumulate), eager",
                      lambda: post(acc0, ref.rgb, ref.level, ref.spread, rgb, frame, flow_e, mp), dev)
        # eager rewrites
        x = torch.cat([rgb, rgb * rgb])[None]
        r = mp.window_radius
        xp = F.pad(x, (r, r, r, r), mode="reflect")
        k = 2 * r + 1
        box = timed("box mean 7x7 (1, 6, H, W), avg_pool2d", lambda: F.avg_pool2d(xp, k, stride=1), dev)
        sep = timed("box mean 7x7, two 1-D pools",
                    lambda: F.avg_pool2d(F.avg_pool2d(xp, (k, 1), stride=1), (1, k), stride=1), dev)
        RESULTS["box_sep_max_abs"] = float((box - sep).abs().max())
        timed("blur 5-tap (H, W), conv2d", lambda: al._blur(grey), dev)
        if dev.type == "cuda":
            compiled(ref, grey, rgb, frame, prior, flow_e, acc_e, mp, dev)
    print(json.dumps({k: v for k, v in RESULTS.items() if not isinstance(v, dict)}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
