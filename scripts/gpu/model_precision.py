"""GPU: the model pass's numerics. Stitched strips against the whole frame, speed, and distance to float32.

Full-size IQ3_S frames (10304 x 7728, random mosaic: the harshest case for rounding), cut several ways (halves,
8 strips, uneven cuts down to a 2-row strip), a second CFA phase, and the `max` tier's 4 orientations; per
precision (float32 + TF32 is the reference; float16 the GPU default). Prints a table, writes JSON.
Usage: python3 scripts/gpu/model_precision.py --json OUT/precision.json [--variants tf32:float32,fp16:float16]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.bench.enhance import IQ3S_H, IQ3S_W, _timed, make_inputs, params_for
from services.pipeline.models.package import configure_cuda_numerics
from services.pipeline.models.registry import PACKAGES_DIR, compute_precision, load_enhancer
from services.pipeline.render import render_mosaic, render_strip

CUTS = {"halves": [0, 5152, IQ3S_H], "8 strips": [i * 1288 for i in range(9)],
        "uneven": [0, 1000, 4444, 4446, 9000, IQ3S_H]}


def stitched_diff(raw: np.ndarray, params: Any, cuts: list[int], dev: str, whole: np.ndarray) -> dict[str, Any]:
    parts = [render_strip(raw, a, b, params, device=dev) for a, b in zip(cuts, cuts[1:], strict=False)]
    d = np.abs(whole.astype(np.int32) - np.concatenate(parts).astype(np.int32))
    return {"max_lsb": int(d.max()), "pixels_off": int((d.max(axis=-1) > 0).sum())}


def variant_rows(name: str, precision: str, package: str, data: Any,
                 dev: str) -> tuple[list[dict[str, Any]], np.ndarray]:
    configure_cuda_numerics(precision == "float32")  # TF32 for the float32 reference (the workers' default)
    rows: list[dict[str, Any]] = []
    params = params_for(package)
    with compute_precision(precision):
        whole = render_mosaic(data.raw, params, device=dev)
        for cut, cuts in CUTS.items():
            rows.append({"variant": name, "check": cut, **stitched_diff(data.raw, params, cuts, dev, whole)})
        crop = data.raw[: IQ3S_H // 2]
        grbg = replace(params, cfa="GRBG")
        rows.append({"variant": name, "check": "GRBG halves of a half frame",
                     **stitched_diff(crop, grbg, [0, 2576, 5152], dev, render_mosaic(crop, grbg, device=dev))})
        quarter, mx = data.raw[: IQ3S_H // 4], replace(params, orientations=4)
        rows.append({"variant": name, "check": "max tier (4 orientations), 3 strips of a quarter frame",
                     **stitched_diff(quarter, mx, [0, 800, 1802, 2576], dev, render_mosaic(quarter, mx, device=dev))})
        enh = load_enhancer("IQ3_S", dev, package=package)
        half = data.mosaic[..., : IQ3S_H // 2, :]
        t_whole = _timed(lambda: enh.enhance(data.mosaic, "RGGB", data.shot, data.read), dev, 3)
        t_half = _timed(lambda: enh.enhance(half, "RGGB", data.shot, data.read), dev, 3)
        rows.append({"variant": name, "check": "enhance s (whole frame; two halves)",
                     "whole_s": float(np.median(t_whole)), "halves_s": 2 * float(np.median(t_half))})
    for r in rows:
        print(f"{name:<14} {r['check']:<58} " + " ".join(f"{k} {v}" for k, v in r.items()
                                                         if k not in ("variant", "check")), flush=True)
    return rows, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--package", default=str(PACKAGES_DIR / "strata_jdd_v2.strata"))
    ap.add_argument("--variants", default="tf32:float32,fp16:float16,bf16:bfloat16",
                    help="NAME:PRECISION,... (the first is the reference)")
    ap.add_argument("--json", type=Path, default=Path("precision.json"))
    args = ap.parse_args()
    data = make_inputs(IQ3S_H, IQ3S_W, args.device)
    variants = [v.split(":", 1) for v in args.variants.split(",") if v]
    rows: list[dict[str, Any]] = []
    ref: np.ndarray | None = None
    for name, precision in variants:
        got, whole = variant_rows(name, precision, args.package, data, args.device)
        if ref is None:
            ref = whole
        else:
            d = np.abs(whole.astype(np.int32) - ref.astype(np.int32))
            got.append({"variant": name, "check": "whole frame vs the first variant (mean, p99.9, max LSB)",
                        "value": [float(d.mean()), float(np.percentile(d, 99.9)), int(d.max())]})
            print(f"{name:<14} vs {variants[0][0]}: mean {d.mean():.2f} p99.9 {np.percentile(d, 99.9):.0f} "
                  f"max {d.max()} LSB")
        rows += got
    info = {"device": torch.cuda.get_device_name(args.device), "torch": torch.__version__}
    args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
