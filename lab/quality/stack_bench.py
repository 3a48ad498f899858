"""Stack quality benchmark: synthetic stacks with known ground truth through the real decode/merge/render path.

For each case it reports PSNR against the ground truth of (a) the project's single-frame render of the
reference frame and (b) the merged stack rendered at the reduced noise level, the gain in dB, (c) the gain of
the equivalent long exposure (the same reference frame with 1/N of the noise, rendered alone: what a merge that
only averages the light could reach), PSNR inside and
outside a moving object's region, the colour difference (mean CIEDE2000, max 16-bit difference) between a
1-group and a 2-group merge, and the time per stage on the chosen device. ``main`` is CLI-callable
(``python -m lab.quality.stack_bench --scale 0.1 --json out.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from lab.args import positive_float, torch_device
from lab.quality.anchors import LIBRAW_AHD, LibRawRunner, libraw_render
from lab.quality.report import CROP_SIZE, CROP_ZOOM, detail_window, write_strip
from lab.synth.stack_synth import synthesize_stack
from lab.synth.unprocess import content_problem
from services.jobs.planner import plan_frame_groups
from services.pipeline.render import RenderParams, render_mosaic
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import (
    frame_shifts,
    fuse_groups,
    merge_frame_group,
    pixel_shift_offsets,
    render_rgb,
    stack_noise_factors,
    stack_params,
)
from services.raw.colour import srgb_decode, srgb_to_xyz_matrix
from services.raw.decode import decode_raw
from services.raw.meta import CFA_PATTERNS, RawMeta

BORDER = 8  # px excluded from every metric: frames shifted by up to max_shift lack data at the edges
_D65_WHITE = np.array([0.95047, 1.0, 1.08883])


# --------------------------------------------------------------------------------------------- metrics


def psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None, peak: float = 65535.0) -> float:
    """PSNR in dB of 16-bit images (H, W, 3), optionally over a (H, W) boolean mask."""
    err = (np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2
    mse = float(err[mask].mean()) if mask is not None else float(err.mean())
    return float("inf") if mse == 0 else float(10 * np.log10(peak**2 / mse))


def srgb16_to_lab(image: np.ndarray) -> np.ndarray:
    """(..., 3) 16-bit sRGB-encoded -> CIE L*a*b* (D65), float64."""
    linear = srgb_decode(np.asarray(image, np.float64) / 65535.0)
    xyz = linear @ srgb_to_xyz_matrix().T / _D65_WHITE
    eps, kappa = 216 / 24389, 24389 / 27
    f = np.where(xyz > eps, np.cbrt(xyz), (kappa * xyz + 16) / 116)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def delta_e_2000(lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """CIEDE2000 colour difference of (..., 3) L*a*b* arrays (Sharma, Wu, Dalal 2005), kL = kC = kH = 1."""
    l1, a1, b1 = np.moveaxis(np.asarray(lab1, np.float64), -1, 0)
    l2, a2, b2 = np.moveaxis(np.asarray(lab2, np.float64), -1, 0)
    c_bar = 0.5 * (np.hypot(a1, b1) + np.hypot(a2, b2))
    g = 0.5 * (1 - np.sqrt(c_bar**7 / (c_bar**7 + 25.0**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1p = np.degrees(np.arctan2(b1, a1p)) % 360
    h2p = np.degrees(np.arctan2(b2, a2p)) % 360
    dl, dc = l2 - l1, c2p - c1p
    dh = h2p - h1p
    dh = np.where(dh > 180, dh - 360, np.where(dh < -180, dh + 360, dh))
    dh = np.where(c1p * c2p == 0, 0.0, dh)
    dhh = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    l_bar, cp_bar = 0.5 * (l1 + l2), 0.5 * (c1p + c2p)
    h_sum = h1p + h2p
    h_bar = np.where(np.abs(h1p - h2p) > 180, np.where(h_sum < 360, h_sum + 360, h_sum - 360), h_sum) / 2
    h_bar = np.where(c1p * c2p == 0, h_sum, h_bar)
    t = (1 - 0.17 * np.cos(np.radians(h_bar - 30)) + 0.24 * np.cos(np.radians(2 * h_bar))
         + 0.32 * np.cos(np.radians(3 * h_bar + 6)) - 0.20 * np.cos(np.radians(4 * h_bar - 63)))
    d_theta = 30 * np.exp(-(((h_bar - 275) / 25) ** 2))
    r_c = 2 * np.sqrt(cp_bar**7 / (cp_bar**7 + 25.0**7))
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / np.sqrt(20 + (l_bar - 50) ** 2)
    s_c = 1 + 0.045 * cp_bar
    s_h = 1 + 0.015 * cp_bar * t
    r_t = -np.sin(np.radians(2 * d_theta)) * r_c
    return np.sqrt((dl / s_l) ** 2 + (dc / s_c) ** 2 + (dhh / s_h) ** 2 + r_t * (dc / s_c) * (dhh / s_h))


# --------------------------------------------------------------------------------------------- cases


@dataclass
class StackCase:
    """One benchmark case."""

    name: str
    frames: int
    moving_object: bool = False
    pixel_shift: bool = False
    walking: bool = False  # the object moves in every frame (synthesize_stack's ``walking``)


@dataclass
class CaseResult:
    name: str
    frames: int
    content: str
    psnr_single: float
    psnr_stack: float
    gain_db: float
    long_exposure_gain_db: float | None = None
    psnr_motion_single: float | None = None
    psnr_motion_stack: float | None = None
    psnr_static_single: float | None = None
    psnr_static_stack: float | None = None
    groups_delta_e_mean: float | None = None
    groups_max_lsb: int | None = None
    psnr_libraw_single: float | None = None  # LibRaw AHD on the reference frame (the same DNG), when asked
    crop: str | None = None  # the crop strip written (``crops_dir``)
    seconds: dict[str, float] = field(default_factory=dict)


def _merge(reference: tuple[np.ndarray, RawMeta], frames: list[tuple[np.ndarray, RawMeta]], params: RenderParams,
           n_groups: int, device: str, pixel_shift: list[tuple[int, int]] | None, timings: dict[str, float]
           ) -> np.ndarray:
    """Merge in ``n_groups`` groups as the coordinator plans them, then fuse: (H, W, 3)."""
    results = []
    t0 = time.perf_counter()
    for group in plan_frame_groups(len(frames), n_groups):
        offsets = [pixel_shift[i] for i in group] if pixel_shift is not None else None
        results.append(merge_frame_group(reference, [frames[i] for i in group], device, params=params,
                                         stack_size=len(frames), positions=group, pixel_shift=offsets))
    timings[f"merge_{n_groups}g"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fused = fuse_groups(results)
    timings[f"fuse_{n_groups}g"] = time.perf_counter() - t0
    return fused


def _decoded(path: Path, npy: Path) -> tuple[np.ndarray, RawMeta]:
    meta = decode_raw(path, npy)
    return np.load(npy), meta


def run_case(case: StackCase, work: Path, *, scale: float, seed: int, noise: float, device: str,
             content: str = "dead_leaves", photos_dir: Path | None = None, cfa: str = "RGGB",
             max_shift: float = 1.5, raw_merge: bool = False, libraw: LibRawRunner | None = None,
             crops_dir: Path | None = None, detail_band: bool = True) -> CaseResult:
    """Synthesize, decode, render and measure one case (``raw_merge``, ``detail_band``: RenderParams'). With
    ``libraw``: LibRaw AHD on the reference frame too, and with ``crops_dir`` a crop strip (:func:`_beside_libraw`)."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    folder = work / f"{content.replace(':', '_').replace('/', '_')}-{case.name.replace(' ', '_').replace(',', '')}"
    shot = synthesize_stack(folder, frames=case.frames, scale=scale, seed=seed, noise=noise,
                            moving_object=case.moving_object, walking=case.walking, pixel_shift=case.pixel_shift,
                            content=content, photos_dir=photos_dir, cfa=cfa, max_shift=max_shift)
    timings["synthesize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    frames = [_decoded(path, folder / f"raw_{i:02d}.npy") for i, path in enumerate(shot.files)]
    timings["decode"] = time.perf_counter() - t0
    truth = tifffile.imread(shot.ground_truth)
    own = shot_render_params(frames[0][1], frames[0][0])  # the reference frame as the service renders a single shot
    t0 = time.perf_counter()
    shifts = frame_shifts(frames[0], frames)  # as the coordinator measures them: the frames' package, pixel shift
    timings["shifts"] = time.perf_counter() - t0
    params = replace(stack_params(own, len(frames), shifts), raw_merge=raw_merge and not case.pixel_shift,
                     detail_band=detail_band and not case.pixel_shift)

    t0 = time.perf_counter()
    single = render_mosaic(frames[0][0], own, device)  # a clean frame turned twice, as the best tier does
    timings["render_single"] = time.perf_counter() - t0

    offsets = pixel_shift_offsets(shifts) if case.pixel_shift else None
    if case.pixel_shift and offsets is None:
        raise RuntimeError("pixel-shift pattern not detected")
    fused = _merge(frames[0], frames, params, 1, device, offsets, timings)
    t0 = time.perf_counter()
    stacked = render_rgb(fused, params, device, stack_noise_factors(case.pixel_shift))
    timings["render_stack"] = time.perf_counter() - t0

    inner = np.zeros(truth.shape[:2], dtype=bool)
    inner[BORDER:-BORDER, BORDER:-BORDER] = True
    p1, pn = psnr(single, truth, inner), psnr(stacked, truth, inner)
    result = CaseResult(case.name, case.frames, content, p1, pn, pn - p1, seconds=timings)
    long_exposure = None if case.moving_object else _long_exposure(
        case, folder, scale=scale, seed=seed, noise=noise, content=content, photos_dir=photos_dir, device=device,
        cfa=cfa, timings=timings)
    if long_exposure is not None:
        result.long_exposure_gain_db = psnr(long_exposure, truth, inner) - p1
    else:
        moving, static = inner & shot.motion_mask, inner & ~shot.motion_mask
        result.psnr_motion_single, result.psnr_motion_stack = psnr(single, truth, moving), psnr(stacked, truth, moving)
        result.psnr_static_single, result.psnr_static_stack = psnr(single, truth, static), psnr(stacked, truth, static)
    if case.frames >= 2:
        stacked2 = render_rgb(_merge(frames[0], frames, params, 2, device, offsets, timings), params, device,
                              stack_noise_factors(case.pixel_shift))
        result.groups_delta_e_mean = float(delta_e_2000(srgb16_to_lab(stacked[inner]),
                                                        srgb16_to_lab(stacked2[inner])).mean())
        result.groups_max_lsb = int(np.abs(stacked.astype(np.int64) - stacked2.astype(np.int64)).max())
    if libraw is not None:
        _beside_libraw(result, libraw, str(shot.files[0]), truth, inner, {
            "single": single, case.name: stacked, "long exposure": long_exposure},
            crops_dir, shot.motion_mask if case.moving_object else None)
    return result


def _beside_libraw(result: CaseResult, libraw: LibRawRunner, dng: str, truth: np.ndarray, inner: np.ndarray,
                   renders: dict[str, np.ndarray | None], crops_dir: Path | None, motion: np.ndarray | None) -> None:
    """Score LibRaw AHD on the reference frame's DNG and, with ``crops_dir``, write the case's crop strip: truth,
    LibRaw, then ``renders`` (a moving object's case: the window around the object)."""
    out, error = libraw.call(libraw_render, dng, LIBRAW_AHD)
    if error is not None:
        return
    image = out[0]
    result.psnr_libraw_single = psnr(image, truth, inner)
    if crops_dir is None:
        return
    if motion is not None and motion.any():
        ys, xs = np.nonzero(motion)
        size = min(CROP_SIZE, truth.shape[0] - 2 * BORDER, truth.shape[1] - 2 * BORDER)
        y = int(np.clip(ys.mean() - size // 2, BORDER, truth.shape[0] - size - BORDER))
        x = int(np.clip(xs.mean() - size // 2, BORDER, truth.shape[1] - size - BORDER))
    else:
        y, x = detail_window(truth, CROP_SIZE)
        size = min(CROP_SIZE, truth.shape[0] - 2 * BORDER, truth.shape[1] - 2 * BORDER)
    tiles = [("ground truth", truth), ("LibRaw AHD (1 frame)", image), ("Strata, 1 frame", renders["single"])]
    tiles += [(f"Strata, {name}", r) for name, r in renders.items() if name != "single" and r is not None]
    name = f"crop_stack_{result.content}_{result.name}".replace(":", "_").replace(" ", "_").replace(",", "")
    path = write_strip(Path(crops_dir) / f"{name}.png", [(label, t[y : y + size, x : x + size]) for label, t in tiles],
                       zoom=CROP_ZOOM)
    result.crop = str(path)


def _long_exposure(case: StackCase, folder: Path, *, scale: float, seed: int, noise: float, content: str,
                   photos_dir: Path | None, device: str, cfa: str = "RGGB",
                   timings: dict[str, float] | None = None) -> np.ndarray:
    """The single-frame render of the same reference frame with 1/N of the noise (the same scene and seed); its
    seconds go to ``timings["long_exposure"]``."""
    t0 = time.perf_counter()
    shot = synthesize_stack(folder / "long_exposure", frames=2, scale=scale, seed=seed, noise=noise / case.frames,
                            content=content, photos_dir=photos_dir, cfa=cfa)
    meta = decode_raw(shot.files[0], folder / "long_exposure" / "raw.npy")
    raw = np.load(folder / "long_exposure" / "raw.npy")
    image = render_mosaic(raw, shot_render_params(meta, raw), device)
    if timings is not None:
        timings["long_exposure"] = time.perf_counter() - t0
    return image


DEFAULT_CASES = (
    StackCase("4 frames", 4),
    StackCase("8 frames", 8),
    StackCase("4 frames, moving object", 4, moving_object=True),
    StackCase("pixel shift", 4, pixel_shift=True),
)
# Run when asked for by name (--case): an object moving in every frame (session 52, docs/QUALITY.md).
EXTRA_CASES = (
    StackCase("4 frames, walking object", 4, moving_object=True, walking=True),
)


def selected_cases(names: Sequence[str] | None) -> list[StackCase]:
    """The cases named (``--case``; extra ones too), or the default run's."""
    return list(DEFAULT_CASES) if names is None else [c for c in DEFAULT_CASES + EXTRA_CASES if c.name in names]


def run_benchmark(cases: Sequence[StackCase] = DEFAULT_CASES, *, scale: float = 0.1, seed: int = 3,
                  noise: float = 0.002, device: str = "cpu", work_dir: Path | None = None,
                  contents: Sequence[str] = ("dead_leaves",), photos_dir: Path | None = None, cfa: str = "RGGB",
                  max_shift: float = 1.5, raw_merge: bool = False, libraw: bool = False,
                  crops_dir: Path | None = None, detail_band: bool = True) -> list[CaseResult]:
    """Run every case on every content in a scratch directory (``cfa``: the frames' CFA pattern; ``max_shift``:
    the largest random shift of a frame, px; ``libraw``: LibRaw AHD on each reference frame beside the renders;
    ``crops_dir``: a crop strip per case, with LibRaw)."""
    with tempfile.TemporaryDirectory(prefix="strata-stack-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(work_dir or tmp)
        runner = stack.enter_context(LibRawRunner()) if libraw or crops_dir is not None else None
        return [run_case(c, work, scale=scale, seed=seed, noise=noise, device=device, content=content,
                         photos_dir=photos_dir, cfa=cfa, max_shift=max_shift, raw_merge=raw_merge, libraw=runner,
                         crops_dir=crops_dir, detail_band=detail_band)
                for content in contents for c in cases]


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(results: Sequence[CaseResult]) -> str:
    """A plain-text table of the results."""
    head = (f"{'content':<12} {'case':<26} {'LibRaw':>7} {'single':>7} {'stack':>7} {'gain':>6} {'long':>6} "
            f"{'mov 1':>6} {'mov N':>6} {'stat 1':>6} {'stat N':>6} {'dE00 2g':>7} {'LSB 2g':>6}")
    rows = [head, "-" * len(head)]
    for r in results:
        long = "-" if r.long_exposure_gain_db is None else f"{r.long_exposure_gain_db:+.2f}"
        rows.append(f"{r.content:<12} {r.name:<26} {_fmt(r.psnr_libraw_single):>7} {r.psnr_single:7.2f} "
                    f"{r.psnr_stack:7.2f} {r.gain_db:+6.2f} "
                    f"{long:>6} {_fmt(r.psnr_motion_single):>6} {_fmt(r.psnr_motion_stack):>6} "
                    f"{_fmt(r.psnr_static_single):>6} {_fmt(r.psnr_static_stack):>6} "
                    f"{_fmt(r.groups_delta_e_mean):>7} {r.groups_max_lsb if r.groups_max_lsb is not None else '-':>6}")
    rows.append("LibRaw: AHD on the reference frame (--libraw); gain: the stack over the single-frame render (dB); "
                "long: the same frame with 1/N of the noise over it")
    rows.append("")
    rows.append("seconds per stage:")
    for r in results:
        rows.append(f"  {r.content:<12} {r.name:<26} " + "  ".join(f"{k} {v:.2f}" for k, v in r.seconds.items()))
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: ``--scale``, ``--seed``, ``--noise``, ``--device``, ``--json PATH``."""
    parser = argparse.ArgumentParser(prog="strata bench stack",
                                     description="Stack quality benchmark on synthetic stacks.")
    parser.add_argument("--scale", type=positive_float, default=0.1)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--noise", type=float, default=0.002, help="shot-noise coefficient (mid noise: 0.002)")
    parser.add_argument("--device", type=torch_device, default="cpu")
    parser.add_argument("--content", action="append", default=None,
                        help="dead_leaves (default), photo:NNN, skimage:NAME or an image path; repeatable")
    parser.add_argument("--photos", type=Path, default=None, help="directory of photo:NNN (../shared/data/photos)")
    parser.add_argument("--cfa", default="RGGB", choices=CFA_PATTERNS, help="the frames' CFA pattern")
    parser.add_argument("--max-shift", type=float, default=1.5, help="largest random frame shift (px)")
    parser.add_argument("--raw-merge", action="store_true",
                        help="also merge the frames' raw samples per colour (STRATA_STACK_RAW_MERGE)")
    parser.add_argument("--no-detail-band", action="store_true",
                        help="average the frames' whole renders (STRATA_STACK_DETAIL_BAND=false)")
    parser.add_argument("--case", action="append", default=None,
                        choices=[c.name for c in DEFAULT_CASES + EXTRA_CASES],
                        help="run only this case (repeatable; default: all but the walking object)")
    parser.add_argument("--libraw", action="store_true", help="also score LibRaw AHD on each reference frame")
    parser.add_argument("--crops", type=Path, default=None,
                        help="write a crop strip per case here (truth, LibRaw AHD, single, stack, long exposure)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    contents = args.content or ["dead_leaves"]
    if args.noise < 0 or args.max_shift < 0:
        parser.error(f"--noise and --max-shift must be >= 0, got {args.noise}, {args.max_shift}")
    for spec in contents:
        problem = content_problem(spec, args.photos, seeded=False)
        if problem:
            parser.error(f"--content {spec}: {problem}")
    cases = selected_cases(args.case)
    results = run_benchmark(cases, scale=args.scale, seed=args.seed, noise=args.noise, device=args.device,
                            contents=contents, photos_dir=args.photos, cfa=args.cfa, max_shift=args.max_shift,
                            raw_merge=args.raw_merge, libraw=args.libraw, crops_dir=args.crops,
                            detail_band=not args.no_detail_band)
    print(format_table(results))
    if args.json:
        payload: dict[str, Any] = {"scale": args.scale, "seed": args.seed, "noise": args.noise, "cfa": args.cfa,
                                   "max_shift": args.max_shift, "raw_merge": args.raw_merge,
                                   "detail_band": not args.no_detail_band,
                                   "device": args.device, "contents": contents, "cases": [r.__dict__ for r in results]}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
