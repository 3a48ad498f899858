"""Single-frame quality benchmark (``strata quality``): Strata's model packages against LibRaw on the same DNGs.

For every held-out shot (photographs :data:`~services.raw.unprocess.PHOTOS_HELD_OUT` and dead-leaves seeds
:data:`DEAD_LEAVES_HELD_OUT`, never used in training) and every noise level, a synthetic IQ3_S DNG is written
(:func:`services.raw.synth.synthesize_shot`, cached) and rendered

* through the project's real pipeline, once per model package: ``decode_raw`` -> ``shot_render_params`` ->
  ``render_mosaic`` (the code the GPU workers run), and
* through LibRaw (rawpy) with colorimetric settings matching the DNG rendering (camera WB, no auto-bright,
  sRGB primaries and transfer curve, 16 bits, file white level kept): AHD, AAHD, DCB, and AHD with FBDD noise
  reduction + 3 median passes. Each LibRaw render runs in a child process, so a LibRaw crash is reported and
  the benchmark goes on. LibRaw's wavelet denoise (``noise_thr``) is never used: it double-frees on small DNGs.

Both are scored against the 16-bit sRGB ground truth: PSNR and SSIM (Wang et al. 2004, Gaussian window
sigma 1.5, K1 = 0.01, K2 = 0.03, per channel, averaged) on [0, 1] sRGB values, excluding an 8-pixel border.
LibRaw's output is checked for geometric alignment (size, offset) and, on noise-free shots, for colour on the
flat areas of the ground truth. ``main`` is CLI-callable (``python -m services.quality.benchmark --help``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Heavy imports (torch, the pipeline) happen inside functions: the LibRaw child process imports this module and
# only needs numpy + rawpy.

CAMERA = "IQ3_S"
SPACE = "srgb"
BORDER = 8  # pixels excluded from every metric (demosaic borders)
DEFAULT_SCALE = 0.1
LEVELS = ("none", "low", "mid", "high")
CFA_CYCLE = ("RGGB", "BGGR", "GRBG", "GBRG")
DEAD_LEAVES_HELD_OUT = (900_000, 900_001)  # inside training/data.py's held-out seed range 900000..900015
PHOTO_SEED_BASE = 910_000  # noise seeds of photo shots (seed + photo number)
CLASSICAL = "classical_v1"
LEARNED = "strata_jdd_v1"
DEFAULT_PACKAGES = (f"{CLASSICAL}.strata", f"{LEARNED}.strata")
SSIM_SIGMA, SSIM_TRUNCATE, SSIM_K1, SSIM_K2 = 1.5, 3.5, 0.01, 0.03
LIBRAW_TIMEOUT_S = 300.0
COLOUR_TOLERANCE = 3e-3  # flat-area mean |LibRaw - truth| above this is flagged (engineer measured <= 2e-3)
CROP_SIZE = 128  # source pixels of a crop tile; shown at CROP_ZOOM (nearest) -> 256 x 256 tiles
CROP_ZOOM = 2

# name -> (demosaic algorithm, FBDD noise reduction, median filter passes)
LIBRAW_METHODS: dict[str, tuple[str, str, int]] = {
    "libraw_ahd": ("AHD", "Off", 0),
    "libraw_aahd": ("AAHD", "Off", 0),
    "libraw_dcb": ("DCB", "Off", 0),
    "libraw_ahd_fbdd_med3": ("AHD", "Full", 3),
}
LIBRAW_AHD = "libraw_ahd"


# --------------------------------------------------------------------------------------------- metrics


def _crop_border(image: np.ndarray, border: int) -> np.ndarray:
    return image[border : image.shape[0] - border, border : image.shape[1] - border] if border else image


def to_unit(image: np.ndarray) -> np.ndarray:
    """uint16 (or uint8) image -> float64 in [0, 1]; float input is returned as float64 unchanged."""
    if image.dtype == np.uint16:
        return image.astype(np.float64) / 65535.0
    if image.dtype == np.uint8:
        return image.astype(np.float64) / 255.0
    return image.astype(np.float64)


def psnr(a: np.ndarray, b: np.ndarray, border: int = BORDER) -> float:
    """PSNR in dB of two images with values in [0, 1] (peak 1), excluding ``border`` pixels; ``inf`` if equal."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    diff = _crop_border(to_unit(a), border) - _crop_border(to_unit(b), border)
    mse = float(np.mean(diff * diff))
    return math.inf if mse == 0.0 else 10.0 * math.log10(1.0 / mse)


def gaussian_window(sigma: float = SSIM_SIGMA, truncate: float = SSIM_TRUNCATE) -> np.ndarray:
    """Normalised 1-D Gaussian taps, radius ``int(truncate * sigma + 0.5)`` (11 taps for sigma 1.5)."""
    radius = int(truncate * sigma + 0.5)
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    return taps / taps.sum()


def _filter_valid(x: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of (H, W, C) float64 along H and W."""
    n = len(taps)
    h, w = x.shape[0] - n + 1, x.shape[1] - n + 1
    rows = np.zeros((h, x.shape[1], x.shape[2]))
    for i, t in enumerate(taps):
        rows += t * x[i : i + h]
    out = np.zeros((h, w, x.shape[2]))
    for i, t in enumerate(taps):
        out += t * rows[:, i : i + w]
    return out


def ssim(a: np.ndarray, b: np.ndarray, border: int = BORDER, data_range: float = 1.0) -> float:
    """Mean SSIM (Wang et al. 2004) of (H, W) or (H, W, C) images, per channel then averaged.

    Gaussian window sigma 1.5 (11 taps), K1 = 0.01, K2 = 0.03, population covariances; the mean runs over the
    positions where the window fits inside the (border-cropped) image, which is what scikit-image's
    ``structural_similarity(gaussian_weights=True, use_sample_covariance=False)`` averages too.
    """
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    x, y = _crop_border(to_unit(a), border), _crop_border(to_unit(b), border)
    if x.ndim == 2:
        x, y = x[..., None], y[..., None]
    taps = gaussian_window()
    if min(x.shape[:2]) < len(taps):
        raise ValueError(f"image {x.shape[:2]} smaller than the SSIM window ({len(taps)} px)")
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    mx, my = _filter_valid(x, taps), _filter_valid(y, taps)
    vx = _filter_valid(x * x, taps) - mx * mx
    vy = _filter_valid(y * y, taps) - my * my
    cxy = _filter_valid(x * y, taps) - mx * my
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())


# ----------------------------------------------------------------------------------------- LibRaw path


def libraw_render(path: str, method: str) -> tuple[np.ndarray, float]:
    """Render a DNG with LibRaw (rawpy) the colorimetric way: (H, W, 3) uint16 sRGB and the seconds it took.

    Camera WB, no auto-bright, sRGB primaries, sRGB curve (``gamma=(2.4, 12.92)``), 16 bits, no flip and
    ``adjust_maximum_thr=0`` (keep the file's white level; LibRaw otherwise rescales by the data maximum).
    Never sets ``noise_thr``. Meant to run in a child process (see :class:`LibRawRunner`).
    """
    import rawpy

    demosaic, fbdd, median_passes = LIBRAW_METHODS[method]
    t0 = time.perf_counter()
    with rawpy.imread(path) as raw:
        out = raw.postprocess(
            use_camera_wb=True,
            no_auto_bright=True,
            output_color=rawpy.ColorSpace.sRGB,
            output_bps=16,
            gamma=(2.4, 12.92),
            user_flip=0,
            adjust_maximum_thr=0.0,
            demosaic_algorithm=getattr(rawpy.DemosaicAlgorithm, demosaic),
            fbdd_noise_reduction=getattr(rawpy.FBDDNoiseReductionMode, fbdd),
            median_filter_passes=median_passes,
        )
    return np.ascontiguousarray(out), time.perf_counter() - t0


class LibRawRunner:
    """Runs functions in one spawned child process; a crash or hang becomes an error message, not our death."""

    def __init__(self, timeout_s: float = LIBRAW_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _discard(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):  # a hung child: kill it, by its own handle
            if proc.is_alive():
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``(fn(*args), None)``, or ``(None, reason)`` when it raised, crashed or timed out."""
        try:
            return self._executor().submit(fn, *args).result(timeout=self.timeout_s), None
        except BrokenProcessPool:
            self._discard()
            return None, "child process crashed (LibRaw abort or signal)"
        except FutureTimeout:
            self._discard()
            return None, f"timed out after {self.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - any error in the child is a result to report
            return None, f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Stop the child process."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> LibRawRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def align_to_truth(image: np.ndarray, truth: np.ndarray, search: int = 2) -> tuple[np.ndarray, np.ndarray, dict]:
    """Register a render with the ground truth: returns both cropped to their common area and what was found.

    A smaller render (margins cropped) is located inside the truth; a same-size one is checked for a shift of
    up to ``search`` pixels. The offset is chosen by the least squared error on a central window.
    """
    hi, wi = image.shape[:2]
    ht, wt = truth.shape[:2]
    if hi > ht or wi > wt:  # larger than the truth: locate the truth inside it instead
        t, i, info = align_to_truth(truth, image, search)
        return i, t, {**info, "offset": [-v for v in info["offset"]]}
    a, t = to_unit(image), to_unit(truth)
    dh, dw = ht - hi, wt - wi
    if (dh, dw) == (0, 0):
        candidates = [(dy, dx) for dy in range(-search, search + 1) for dx in range(-search, search + 1)]
    else:
        candidates = [(dy, dx) for dy in range(dh + 1) for dx in range(dw + 1)]
    win = min(256, hi - 2 * search - 2 * BORDER, wi - 2 * search - 2 * BORDER)
    cy, cx = (hi - win) // 2, (wi - win) // 2
    ref = a[cy : cy + win, cx : cx + win]

    def err(dy: int, dx: int) -> float:
        patch = t[cy + dy : cy + dy + win, cx + dx : cx + dx + win]
        return float(np.mean((patch - ref) ** 2))

    best = min(candidates, key=lambda d: err(*d))
    dy, dx = best
    info = {"image_shape": [hi, wi], "truth_shape": [ht, wt], "offset": [dy, dx], "aligned": best == (0, 0)}
    if (dh, dw) != (0, 0):
        return image, truth[dy : dy + hi, dx : dx + wi], info
    # same size, shifted: image(y, x) ~ truth(y + dy, x + dx); keep the overlap
    y0, y1 = max(0, -dy), hi - max(0, dy)
    x0, x1 = max(0, -dx), wi - max(0, dx)
    return image[y0:y1, x0:x1], truth[y0 + dy : y1 + dy, x0 + dx : x1 + dx], info


def _box_mean(x: np.ndarray, r: int) -> np.ndarray:
    """Mean over (2r+1)^2 windows, 'valid' positions, of (H, W, C)."""
    c = np.cumsum(np.cumsum(np.pad(x, ((1, 0), (1, 0), (0, 0))), axis=0), axis=1)
    n = 2 * r + 1
    return (c[n:, n:] - c[:-n, n:] - c[n:, :-n] + c[:-n, :-n]) / (n * n)


def colour_check(image: np.ndarray, truth: np.ndarray, radius: int = 3, flat_std: float = 2e-3,
                 bright: float = 0.9) -> dict:
    """Compare a noise-free render with the truth on the truth's flat, unsaturated areas.

    Flat: local std (window ``2 radius + 1``) below ``flat_std`` in every channel. Unsaturated: every channel
    of the truth below ``bright`` (encoded): near-white colours can exceed the sensor's white level once
    unprocessed to camera RGB, so every renderer clips them alike and they say nothing about colour. Returns the
    number of such pixels, the mean absolute and the mean signed difference per channel ([0, 1] sRGB units);
    interior pixels only (``BORDER`` + ``radius``).
    """
    a, t = _crop_border(to_unit(image), BORDER), _crop_border(to_unit(truth), BORDER)
    mean = _box_mean(t, radius)
    std = np.sqrt(np.maximum(_box_mean(t * t, radius) - mean * mean, 0.0)).max(axis=2)
    inner = (a - t)[radius : a.shape[0] - radius, radius : a.shape[1] - radius]
    flat = (std < flat_std) & (t[radius : t.shape[0] - radius, radius : t.shape[1] - radius].max(axis=2) < bright)
    n = int(flat.sum())
    if n == 0:
        return {"flat_pixels": 0, "mean_abs_diff": None, "mean_signed_diff": None}
    d = inner[flat]
    return {"flat_pixels": n, "mean_abs_diff": float(np.abs(d).mean()),
            "mean_signed_diff": [float(v) for v in d.mean(axis=0)]}


# ------------------------------------------------------------------------------------------ Strata path


@dataclass(frozen=True)
class Shot:
    """One held-out shot: a name, the synth content spec, the seed and the CFA phase."""

    name: str
    content: str
    seed: int
    cfa: str


def held_out_shots(photos_dir: Path | str | None = None, notes: list[str] | None = None) -> list[str]:
    """Default content specs: the held-out photographs that exist in ``photos_dir`` + held-out dead leaves."""
    from services.raw.unprocess import PHOTOS_HELD_OUT, photo_path

    specs = []
    for name in PHOTOS_HELD_OUT:
        try:
            photo_path(name, photos_dir)
        except ValueError:
            continue
        specs.append(f"photo:{name}")
    if len(specs) < len(PHOTOS_HELD_OUT) and notes is not None:
        notes.append(f"held-out photos found: {len(specs)} of {len(PHOTOS_HELD_OUT)} (photos dir {photos_dir})")
    return specs + [f"dead_leaves:{s}" for s in DEAD_LEAVES_HELD_OUT]


def parse_shots(specs: Sequence[str], cfa: str | None = None, notes: list[str] | None = None) -> list[Shot]:
    """Content specs -> shots. ``photo:NNN`` / ``skimage:NAME`` / a path, or ``dead_leaves[:SEED]``.

    The CFA phase is ``cfa`` for every shot, else it cycles through all four phases over the shots.
    """
    from services.raw.unprocess import PHOTOS_HELD_OUT

    shots = []
    for i, spec in enumerate(specs):
        phase = cfa or CFA_CYCLE[i % len(CFA_CYCLE)]
        if spec.startswith("dead_leaves"):
            seed = int(spec.split(":", 1)[1]) if ":" in spec else DEAD_LEAVES_HELD_OUT[0]
            shots.append(Shot(f"dead_leaves_{seed}", "dead_leaves", seed, phase))
            if notes is not None and not 900_000 <= seed < 900_016:
                notes.append(f"dead_leaves seed {seed} is outside the held-out range 900000..900015")
            continue
        label = spec.split(":", 1)[1] if ":" in spec else Path(spec).stem
        digits = "".join(ch for ch in label if ch.isdigit())
        seed = PHOTO_SEED_BASE + (int(digits) if digits else i)
        shots.append(Shot(f"{spec.split(':', 1)[0] if ':' in spec else 'file'}_{label}", spec, seed, phase))
        if notes is not None and spec.startswith("photo:") and label not in PHOTOS_HELD_OUT:
            notes.append(f"{spec} is a training photograph, not held out")
    return shots


def synth_cached(cache: Path, shot: Shot, level: str, scale: float, photos_dir: Path | str | None) -> Path:
    """The DNG of ``shot`` at ``level`` (synthesised once into ``cache``); ground truth sits beside it."""
    from services.raw.synth import synthesize_shot

    out = cache / f"{shot.name}_{shot.cfa}_s{scale:g}_{level}_seed{shot.seed}"
    dng = out / "frame_00.dng"
    if not (dng.exists() and (out / "ground_truth.tif").exists()):
        synthesize_shot(CAMERA, out, scale=scale, seed=shot.seed, noise=level, cfa=shot.cfa, content=shot.content,
                        space=SPACE, photos_dir=photos_dir)
    return dng


def package_label(package: str) -> str:
    """Method name of a package: its file stem (``classical_v1.strata`` -> ``classical_v1``)."""
    name = Path(package).name
    return name[: -len(".strata")] if name.endswith(".strata") else name


def package_available(package: str) -> bool:
    """Whether the package resolves to an existing file or directory."""
    from services.pipeline.models.registry import resolve_package

    return resolve_package(package).exists()


def decode(dng: Path, work: Path) -> tuple[Any, np.ndarray, float]:
    """``decode_raw`` in its sandboxed child: (RawMeta, mosaic, seconds)."""
    from services.raw.decode import decode_raw

    t0 = time.perf_counter()
    npy = work / f"{dng.parent.name}.npy"
    meta = decode_raw(dng, npy)
    mosaic = np.load(npy)
    npy.unlink(missing_ok=True)
    return meta, mosaic, time.perf_counter() - t0


def render_strata(meta: Any, mosaic: np.ndarray, package: str, device: str,
                  sharpen_amount: float | None = None) -> tuple[np.ndarray, float]:
    """The real pipeline: ``shot_render_params`` (sRGB, IQ3_S, ``package``) -> ``render_mosaic``; (image, s).

    ``sharpen_amount`` overrides the pipeline's unsharp-mask amount (a diagnostic; None keeps the default).
    """
    from dataclasses import replace

    import torch

    from services.pipeline.render import render_mosaic
    from services.pipeline.shot import shot_render_params

    t0 = time.perf_counter()
    params = shot_render_params(meta, mosaic, SPACE, CAMERA, model=package)
    if sharpen_amount is not None:
        params = replace(params, sharpen_amount=sharpen_amount)
    out = render_mosaic(mosaic, params, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def warm_up(package: str, device: str) -> None:
    """Load the package onto the device once, so timings exclude loading (workers keep packages resident)."""
    from services.pipeline.models.registry import load_enhancer

    load_enhancer(CAMERA, device, package=package)


# ----------------------------------------------------------------------------------------------- report


def _nanmean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else None


def summarise(rows: list[dict], levels: Sequence[str], methods: Sequence[str]) -> dict:
    """Means per level x method, the best LibRaw method per level and each package's margins (dB)."""
    means: dict[str, dict[str, dict]] = {}
    best: dict[str, str | None] = {}
    margins: dict[str, dict[str, dict]] = {}
    for level in levels:
        means[level] = {}
        for m in methods:
            sel = [r for r in rows if r["level"] == level and r["method"] == m and r.get("psnr") is not None]
            if sel:
                means[level][m] = {
                    "psnr": _nanmean([min(r["psnr"], 200.0) for r in sel]),
                    "ssim": _nanmean([r["ssim"] for r in sel]),
                    "seconds": _nanmean([r["seconds"] for r in sel]),
                    "shots": len(sel),
                }
        libraw = {m: v for m, v in means[level].items() if m in LIBRAW_METHODS}
        best[level] = max(libraw, key=lambda m: libraw[m]["psnr"]) if libraw else None
        margins[level] = {}
        for m, v in means[level].items():
            if m in LIBRAW_METHODS:
                continue
            entry: dict[str, float | None] = {"vs_libraw_ahd": None, "vs_best_libraw": None}
            if LIBRAW_AHD in libraw:
                entry["vs_libraw_ahd"] = v["psnr"] - libraw[LIBRAW_AHD]["psnr"]
            if best[level] is not None:
                entry["vs_best_libraw"] = v["psnr"] - libraw[best[level]]["psnr"]  # type: ignore[index]
            margins[level][m] = entry
    return {"mean": means, "best_libraw": best, "margins": margins}


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_report(report: dict) -> None:
    """Print the per level x method table and the margins (rich when available)."""
    summary, levels, methods = report["summary"], report["settings"]["levels"], report["methods"]
    header = ["level", "method", "PSNR dB", "SSIM", "s/shot", "shots"]
    rows: list[list[str]] = []
    for level in levels:
        for m in methods:
            v = summary["mean"].get(level, {}).get(m)
            if v is None:
                continue
            star = " *" if summary["best_libraw"].get(level) == m else ""
            rows.append([level, m + star, _fmt(v["psnr"], ".2f"), _fmt(v["ssim"], ".4f"), _fmt(v["seconds"], ".3f"),
                         str(v["shots"])])
    margin_rows = [[level, m, _fmt(e["vs_libraw_ahd"], "+.2f"), _fmt(e["vs_best_libraw"], "+.2f"),
                    str(summary["best_libraw"].get(level))]
                   for level in levels for m, e in summary["margins"].get(level, {}).items()]
    margin_header = ["level", "package", "vs LibRaw AHD dB", "vs best LibRaw dB", "best LibRaw"]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        for head, body in ((header, rows), (margin_header, margin_rows)):
            print(" | ".join(head))
            for r in body:
                print(" | ".join(r))
            print()
    else:
        console = Console()
        for title, head, body in (("Quality vs ground truth (* = best LibRaw)", header, rows),
                                  ("Margins of Strata packages", margin_header, margin_rows)):
            table = Table(title=title)
            for h in head:
                table.add_column(h, justify="left" if h in ("level", "method", "package", "best LibRaw") else "right")
            for r in body:
                table.add_row(*r)
            console.print(table)
    for note in report["notes"]:
        print(f"note: {note}")


def markdown_tables(report: dict) -> str:
    """The mean table (level x method) and the margins as Markdown, for docs/QUALITY.md."""
    summary, levels, methods = report["summary"], report["settings"]["levels"], report["methods"]
    lines = ["| level | method | PSNR dB | SSIM | s/shot | shots |", "|---|---|---:|---:|---:|---:|"]
    for level in levels:
        for m in methods:
            v = summary["mean"].get(level, {}).get(m)
            if v is not None:
                name = f"**{m}** (best LibRaw)" if summary["best_libraw"].get(level) == m else m
                lines.append(f"| {level} | {name} | {_fmt(v['psnr'], '.2f')} | {_fmt(v['ssim'], '.4f')} | "
                             f"{_fmt(v['seconds'], '.3f')} | {v['shots']} |")
    lines += ["", "| level | package | vs LibRaw AHD (dB) | vs best LibRaw (dB) | best LibRaw |",
              "|---|---|---:|---:|---|"]
    for level in levels:
        for m, e in summary["margins"].get(level, {}).items():
            lines.append(f"| {level} | {m} | {_fmt(e['vs_libraw_ahd'], '+.2f')} | "
                         f"{_fmt(e['vs_best_libraw'], '+.2f')} | {summary['best_libraw'].get(level)} |")
    return "\n".join(lines) + "\n"


def machine_info(device: str) -> dict:
    """Host, library versions and the accelerator used."""
    import rawpy
    import torch

    info: dict[str, Any] = {
        "host": platform.node(), "platform": platform.platform(), "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "rawpy": rawpy.__version__,
        "libraw": ".".join(str(v) for v in rawpy.libraw_version), "numpy": np.__version__, "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


# ----------------------------------------------------------------------------------------------- crops


def _detail_window(truth: np.ndarray, size: int) -> tuple[int, int]:
    """Top-left of the ``size`` x ``size`` window (stride size/4, inside BORDER) with the most gradient energy."""
    g = to_unit(truth).mean(axis=2)
    energy = np.abs(np.diff(g, axis=0))[:, :-1] + np.abs(np.diff(g, axis=1))[:-1]
    h, w = energy.shape
    size = min(size, h - 2 * BORDER, w - 2 * BORDER)
    step = max(size // 4, 1)
    best, pos = -1.0, (BORDER, BORDER)
    for y in range(BORDER, h - size - BORDER + 1, step):
        for x in range(BORDER, w - size - BORDER + 1, step):
            e = float(energy[y : y + size, x : x + size].sum())
            if e > best:
                best, pos = e, (y, x)
    return pos


def write_strip(path: Path, tiles: list[tuple[str, np.ndarray]], zoom: int = CROP_ZOOM, gap: int = 4) -> Path:
    """Save labelled 8-bit tiles (uint16 or uint8 (h, w, 3)) side by side as a PNG, each enlarged ``zoom`` times
    by pixel replication (demosaic artefacts stay visible, PNG stays small)."""
    from PIL import Image, ImageDraw

    head = 16
    h, w = (zoom * n for n in tiles[0][1].shape[:2])
    canvas = Image.new("RGB", (len(tiles) * w + (len(tiles) - 1) * gap, h + head), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for i, (label, tile) in enumerate(tiles):
        arr = tile if tile.dtype == np.uint8 else np.rint(to_unit(tile) * 255).clip(0, 255).astype(np.uint8)
        arr = np.repeat(np.repeat(arr, zoom, axis=0), zoom, axis=1)
        canvas.paste(Image.fromarray(arr), (i * (w + gap), head))
        draw.text((i * (w + gap) + 2, 2), label, fill=(0, 0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path, optimize=True)
    return path


# ------------------------------------------------------------------------------------------------- run


def run_benchmark(
    *,
    scale: float = DEFAULT_SCALE,
    levels: Sequence[str] = LEVELS,
    content: Sequence[str] | None = None,
    photos_dir: Path | str | None = None,
    cfa: str | None = None,
    device: str | None = None,
    methods: Sequence[str] | None = None,
    limit: int | None = None,
    crops_dir: Path | None = None,
    crop_size: int = CROP_SIZE,
    crop_zoom: int = CROP_ZOOM,
    cache_dir: Path | None = None,
    sharpen_amount: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark and return the report (settings, machine, per-shot rows, summary, notes).

    ``methods``: package names/paths (``classical_v1.strata``) and LibRaw names (:data:`LIBRAW_METHODS`);
    default: :data:`DEFAULT_PACKAGES` + every LibRaw method. A package that does not exist is skipped with a
    note. ``cache_dir`` keeps the synthetic DNGs between runs (default: a temporary directory);
    ``sharpen_amount`` overrides the pipeline's sharpen amount (diagnostic; None = as the workers render).
    """
    import tifffile
    import torch

    from services.raw.unprocess import noise_level

    say = progress or (lambda _msg: None)
    notes: list[str] = []
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    for level in levels:
        noise_level(level)  # validates
    requested = list(methods) if methods else [*DEFAULT_PACKAGES, *LIBRAW_METHODS]
    packages, libraw_methods, skipped = [], [], {}
    for m in requested:
        if m in LIBRAW_METHODS:
            libraw_methods.append(m)
        elif package_available(m):
            packages.append(m)
        else:
            skipped[package_label(m)] = f"package {m} not found"
            notes.append(f"skipped {package_label(m)}: package {m} not found")
    pkg_labels: dict[str, str] = {}
    for p in packages:  # two packages with one file name (shipped + a path): the second is named by its path
        pkg_labels[p] = package_label(p) if package_label(p) not in pkg_labels.values() else p
    labels = list(pkg_labels.values()) + libraw_methods
    specs = list(content) if content else held_out_shots(photos_dir, notes)
    shots = parse_shots(specs, cfa, notes)
    if limit is not None:
        shots = shots[:limit]
    for p in packages:
        warm_up(p, device)

    rows: list[dict] = []
    alignment: dict[str, dict] = {}
    colour: dict[str, dict] = {}
    crops: dict[str, Path] = {}
    crop_tiles: dict[str, dict[str, np.ndarray]] = {}
    with tempfile.TemporaryDirectory(prefix="strata-quality-") as tmp, LibRawRunner() as runner:
        cache = Path(cache_dir) if cache_dir else Path(tmp) / "shots"
        cache.mkdir(parents=True, exist_ok=True)
        for level in levels:
            for k, shot in enumerate(shots):
                t0 = time.perf_counter()
                dng = synth_cached(cache, shot, level, scale, photos_dir)
                truth = tifffile.imread(dng.parent / "ground_truth.tif")
                synth_s = time.perf_counter() - t0
                meta, mosaic, decode_s = decode(dng, Path(tmp))
                win = _detail_window(truth, crop_size) if k == 0 and crops_dir else None
                tiles: dict[str, np.ndarray] = {}
                if win is not None:
                    tiles["ground truth"] = truth[win[0] : win[0] + crop_size, win[1] : win[1] + crop_size]

                def score(method: str, image: np.ndarray, seconds: float, ref: np.ndarray, extra: dict,
                          _tiles: dict[str, np.ndarray] = tiles, _win: tuple[int, int] | None = win,
                          _shot: Shot = shot, _level: str = level) -> None:
                    row = {"shot": _shot.name, "content": _shot.content, "cfa": _shot.cfa, "level": _level,
                           "method": method, "psnr": psnr(image, ref), "ssim": ssim(image, ref),
                           "seconds": seconds, **extra}
                    rows.append(row)
                    if _win is not None and image.shape == ref.shape:
                        _tiles[method] = image[_win[0] : _win[0] + crop_size, _win[1] : _win[1] + crop_size]

                for pkg in packages:
                    image, secs = render_strata(meta, mosaic, pkg, device, sharpen_amount)
                    score(pkg_labels[pkg], image, secs, truth, {"decode_seconds": decode_s})
                    if level == "none":
                        colour[f"{shot.name}/{pkg_labels[pkg]}"] = colour_check(image, truth)
                for m in libraw_methods:
                    result, error = runner.call(libraw_render, str(dng), m)
                    if error is not None:
                        rows.append({"shot": shot.name, "content": shot.content, "cfa": shot.cfa, "level": level,
                                     "method": m, "psnr": None, "ssim": None, "seconds": None, "error": error})
                        notes.append(f"{m} failed on {shot.name} ({level}): {error}")
                        continue
                    image, secs = result
                    aligned, ref, info = align_to_truth(image, truth)
                    alignment[f"{shot.name}/{level}/{m}"] = info
                    if not info["aligned"] or aligned.shape != truth.shape:
                        notes.append(f"{m} on {shot.name} ({level}): offset {info['offset']}, shape "
                                     f"{info['image_shape']} vs truth {info['truth_shape']}; scored on the overlap")
                    score(m, aligned, secs, ref, {})
                    if level == "none":
                        check = colour_check(aligned, ref)
                        colour[f"{shot.name}/{m}"] = check
                        if check["mean_abs_diff"] is not None and check["mean_abs_diff"] > COLOUR_TOLERANCE:
                            notes.append(f"{m} on {shot.name}: flat-area colour differs from the truth by "
                                         f"{check['mean_abs_diff']:.2e} (> {COLOUR_TOLERANCE:g})")
                if tiles:
                    crop_tiles[level] = tiles
                done = [r for r in rows if r["shot"] == shot.name and r["level"] == level and r["psnr"] is not None]
                say(f"{level:>4} {shot.name:<20} synth {synth_s:5.1f}s  "
                    + "  ".join(f"{r['method']} {r['psnr']:.2f}" for r in done))

    summary = summarise(rows, levels, labels)
    if crops_dir is not None:
        for level, tiles in crop_tiles.items():
            best = summary["best_libraw"].get(level)
            order = [("ground truth", "ground truth")]
            if best in tiles:
                order.append((f"LibRaw best: {best.removeprefix('libraw_')}", best))  # type: ignore[union-attr]
            order += [(lab, lab) for lab in labels if lab not in LIBRAW_METHODS and lab in tiles]
            shot_name = shots[0].name
            crops[level] = write_strip(Path(crops_dir) / f"crop_{level}_{shot_name}.png",
                                       [(name, tiles[key]) for name, key in order], zoom=crop_zoom)
    return {
        "benchmark": "strata quality",
        "settings": {"camera": CAMERA, "space": SPACE, "scale": scale, "levels": list(levels),
                     "noise_levels": {lv: vars(noise_level(lv)) for lv in levels},
                     "shots": [vars(s) for s in shots], "border": BORDER,
                     "ssim": {"sigma": SSIM_SIGMA, "truncate": SSIM_TRUNCATE, "k1": SSIM_K1, "k2": SSIM_K2,
                              "per_channel_mean": True},
                     "libraw": {m: {"demosaic": d, "fbdd": f, "median_passes": n, "use_camera_wb": True,
                                    "no_auto_bright": True, "output_color": "sRGB", "gamma": [2.4, 12.92],
                                    "output_bps": 16, "user_flip": 0, "adjust_maximum_thr": 0.0}
                                for m, (d, f, n) in LIBRAW_METHODS.items() if m in libraw_methods},
                     "packages": packages, "sharpen_amount_override": sharpen_amount,
                     "photos_dir": str(photos_dir) if photos_dir else None},
        "machine": machine_info(device),
        "methods": labels,
        "skipped": skipped,
        "rows": rows,
        "summary": summary,
        "alignment": alignment,
        "colour_check": colour,
        "crops": {k: str(v) for k, v in crops.items()},
        "notes": notes,
    }


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``strata quality``."""
    ap = argparse.ArgumentParser(prog="strata quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=DEFAULT_SCALE, help="frame size as a fraction of IQ3_S")
    ap.add_argument("--levels", default=",".join(LEVELS), help="noise levels (names or shot coefficients)")
    ap.add_argument("--content", default=None,
                    help="comma list: photo:NNN, skimage:NAME, a path, dead_leaves:SEED (default: held-out set)")
    ap.add_argument("--photos-dir", type=Path, default=None, help="photographs (default ../shared/data/photos)")
    ap.add_argument("--cfa", default=None, choices=CFA_CYCLE, help="one CFA phase (default: cycle all four)")
    ap.add_argument("--device", default=None, help="torch device for the Strata path (default cuda if present)")
    ap.add_argument("--methods", default=None,
                    help="comma list of packages (name or path) and LibRaw methods "
                         f"({', '.join(LIBRAW_METHODS)}); default: all")
    ap.add_argument("--limit", type=int, default=None, help="at most N shots per level")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--markdown", type=Path, default=None, help="write the tables as Markdown here")
    ap.add_argument("--crops", type=Path, default=None, help="write PNG crop strips (one shot per level) here")
    ap.add_argument("--crop-size", type=int, default=CROP_SIZE, help="source pixels per crop tile")
    ap.add_argument("--crop-zoom", type=int, default=CROP_ZOOM, help="pixel-replication zoom of the crop tiles")
    ap.add_argument("--cache", type=Path, default=None, help="keep synthetic DNGs here (default: temporary)")
    ap.add_argument("--sharpen-amount", type=float, default=None,
                    help="diagnostic: override the pipeline's sharpen amount (default: as the workers render)")
    ap.add_argument("--quiet", action="store_true", help="no per-shot progress lines")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: parse ``argv``, run, print the tables, write JSON; returns 0 (1 when nothing was scored)."""
    args = build_parser().parse_args(argv)
    report = run_benchmark(
        scale=args.scale, levels=_csv(args.levels), content=_csv(args.content) if args.content else None,
        photos_dir=args.photos_dir, cfa=args.cfa, device=args.device,
        methods=_csv(args.methods) if args.methods else None, limit=args.limit, crops_dir=args.crops,
        crop_size=args.crop_size, crop_zoom=args.crop_zoom, cache_dir=args.cache,
        sharpen_amount=args.sharpen_amount,
        progress=None if args.quiet else (lambda msg: print(msg, flush=True)),
    )
    print_report(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_json_safe(report), indent=1))
        print(f"wrote {args.json}")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_tables(report))
        print(f"wrote {args.markdown}")
    return 0 if any(r["psnr"] is not None for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
