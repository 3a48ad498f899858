"""Single-frame quality benchmark (``strata quality``): Strata's model packages against LibRaw on the same DNGs.

For every held-out shot (photographs :data:`~lab.synth.unprocess.PHOTOS_HELD_OUT` and dead-leaves seeds
:data:`DEAD_LEAVES_HELD_OUT`, never used in training) and every noise level, a synthetic IQ3_S DNG is written
(:func:`lab.synth.synth.synthesize_shot`, cached) and rendered

* through the project's real pipeline, once per model package: ``decode_raw`` -> ``shot_render_params`` ->
  ``render_mosaic`` (the code the GPU workers run), and
* through LibRaw (rawpy) with colorimetric settings matching the DNG rendering (camera WB, no auto-bright,
  sRGB primaries and transfer curve, 16 bits, file white level kept): AHD, AAHD, DCB, and AHD with FBDD noise
  reduction + 3 median passes. Each LibRaw render runs in a child process, so a LibRaw crash is reported and
  the benchmark goes on. LibRaw's wavelet denoise (``noise_thr``) is never used: it double-frees on small DNGs.

Both are scored against the 16-bit sRGB ground truth: PSNR and SSIM (Wang et al. 2004, Gaussian window
sigma 1.5, K1 = 0.01, K2 = 0.03, per channel, averaged) on [0, 1] sRGB values, excluding an 8-pixel border.
LibRaw's output is checked for geometric alignment (size, offset) and, on noise-free shots, for colour on the
flat areas of the ground truth.

Modules: :mod:`lab.quality.shots` (the held-out shots), :mod:`lab.quality.strata` (the Strata path),
:mod:`lab.quality.anchors` (LibRaw), :mod:`lab.quality.metrics`, :mod:`lab.quality.report`; this module runs
them (:func:`run_benchmark`), :mod:`lab.quality.cli` is ``strata quality`` (``python -m lab.quality.cli --help``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lab.quality.anchors import LIBRAW_METHODS, LibRawRunner, libraw_render
from lab.quality.artefacts import ARTEFACT_CONTENT, every_phase, measure, summarise_artefacts
from lab.quality.metrics import (
    BORDER,
    SSIM_K1,
    SSIM_K2,
    SSIM_SIGMA,
    SSIM_TRUNCATE,
    align_to_truth,
    colour_check,
    psnr,
    ssim,
)
from lab.quality.report import CROP_SIZE, CROP_ZOOM, detail_window, machine_info, summarise, write_strip
from lab.quality.shots import CAMERA, LEVELS, SPACE, Shot, held_out_shots, parse_shots, synth_cached
from lab.quality.strata import DEFAULT_PACKAGES, decode, package_available, package_label, render_strata, warm_up
from lab.synth.scenes import scene_name

# Heavy imports (torch, the pipeline) happen inside functions: the LibRaw child process imports
# lab.quality.anchors and only needs numpy + rawpy.

DEFAULT_SCALE = 0.1
COLOUR_TOLERANCE = 3e-3  # flat-area mean |LibRaw - truth| above this is flagged (engineer measured <= 2e-3)


@dataclass(frozen=True)
class Methods:
    """What a run compares: model packages (each with its label) and LibRaw methods; what was skipped."""

    packages: list[str]
    libraw: list[str]
    skipped: dict[str, str]
    label_of: dict[str, str]  # package -> method label

    @property
    def labels(self) -> list[str]:
        return list(self.label_of.values()) + self.libraw


def select_methods(methods: Sequence[str] | None, notes: list[str]) -> Methods:
    """Split ``methods`` (default: :data:`DEFAULT_PACKAGES` + every LibRaw method) into packages and LibRaw
    methods; a package that does not exist is skipped with a note."""
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
    return Methods(packages, libraw_methods, skipped, pkg_labels)


def select_shots(content: Sequence[str] | None, photos_dir: Path | str | None, cfa: str | None, limit: int | None,
                 notes: list[str], artefacts: bool = False) -> list[Shot]:
    """The shots of ``content`` (default: the held-out set; with ``artefacts`` the artefact scenes and controls of
    :mod:`lab.quality.artefacts`, each at the four CFA phases unless ``cfa``), at most ``limit``."""
    specs = list(content) if content else list(ARTEFACT_CONTENT) if artefacts else held_out_shots(photos_dir, notes)
    if artefacts and cfa is None:
        specs = every_phase(specs)
    shots = parse_shots(specs, cfa, notes)
    return shots[:limit] if limit is not None else shots


@dataclass(frozen=True)
class RunConfig:
    """The per-shot settings of a run."""

    scale: float
    photos_dir: Path | str | None
    device: str
    crops: bool
    crop_size: int
    sharpen_amount: float | None


@dataclass
class Results:
    """What a run accumulates: per-shot rows, LibRaw alignment, colour checks, crop tiles, notes."""

    notes: list[str]
    rows: list[dict] = field(default_factory=list)
    alignment: dict[str, dict] = field(default_factory=dict)
    colour: dict[str, dict] = field(default_factory=dict)
    crop_tiles: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass
class ShotRun:
    """One shot at one noise level: its ground truth and, for the crop strip, the detail window and tiles."""

    shot: Shot
    level: str
    truth: np.ndarray
    window: tuple[int, int] | None
    crop_size: int
    tiles: dict[str, np.ndarray] = field(default_factory=dict)

    def tile(self, image: np.ndarray) -> np.ndarray:
        assert self.window is not None
        y, x = self.window
        return image[y : y + self.crop_size, x : x + self.crop_size]

    def row(self, method: str, **values: Any) -> dict:
        return {"shot": self.shot.name, "content": self.shot.content, "cfa": self.shot.cfa, "level": self.level,
                "method": method, **values}

    def score(self, res: Results, method: str, image: np.ndarray, seconds: float, ref: np.ndarray,
              extra: dict) -> None:
        res.rows.append(self.row(method, psnr=psnr(image, ref), ssim=ssim(image, ref), seconds=seconds, **extra,
                                 **(measure(self.shot.content, image, ref) if ref.shape == self.truth.shape else {})))
        if self.window is not None and image.shape == ref.shape:
            self.tiles[method] = self.tile(image)


def score_packages(run: ShotRun, res: Results, meta: Any, mosaic: np.ndarray, decode_s: float, methods: Methods,
                   cfg: RunConfig) -> None:
    """Render the shot through the Strata pipeline with every package and score it."""
    for pkg in methods.packages:
        image, secs = render_strata(meta, mosaic, pkg, cfg.device, cfg.sharpen_amount)
        run.score(res, methods.label_of[pkg], image, secs, run.truth, {"decode_seconds": decode_s})
        if run.level == "none":
            res.colour[f"{run.shot.name}/{methods.label_of[pkg]}"] = colour_check(image, run.truth)


def score_libraw(run: ShotRun, res: Results, runner: LibRawRunner, dng: Path, libraw_methods: Sequence[str]) -> None:
    """Render the shot with every LibRaw method (child process), register it with the truth and score it."""
    shot, level = run.shot, run.level
    for m in libraw_methods:
        result, error = runner.call(libraw_render, str(dng), m)
        if error is not None:
            res.rows.append(run.row(m, psnr=None, ssim=None, seconds=None, error=error))
            res.notes.append(f"{m} failed on {shot.name} ({level}): {error}")
            continue
        image, secs = result
        # a periodic test scene matches itself shifted: LibRaw's registration is checked on natural content
        aligned, ref, info = align_to_truth(image, run.truth, search=0 if scene_name(shot.content) else 2)
        res.alignment[f"{shot.name}/{level}/{m}"] = info
        if not info["aligned"] or aligned.shape != run.truth.shape:
            res.notes.append(f"{m} on {shot.name} ({level}): offset {info['offset']}, shape "
                             f"{info['image_shape']} vs truth {info['truth_shape']}; scored on the overlap")
        run.score(res, m, aligned, secs, ref, {})
        if level == "none":
            check = colour_check(aligned, ref)
            res.colour[f"{shot.name}/{m}"] = check
            if check["mean_abs_diff"] is not None and check["mean_abs_diff"] > COLOUR_TOLERANCE:
                res.notes.append(f"{m} on {shot.name}: flat-area colour differs from the truth by "
                                 f"{check['mean_abs_diff']:.2e} (> {COLOUR_TOLERANCE:g})")


def bench_shot(shot: Shot, level: str, first: bool, cache: Path, work: Path, runner: LibRawRunner,
               methods: Methods, cfg: RunConfig, res: Results) -> str:
    """Synthesise (cached), decode and score one shot at one level with every method; the progress line."""
    import tifffile

    t0 = time.perf_counter()
    dng = synth_cached(cache, shot, level, cfg.scale, cfg.photos_dir)
    truth = tifffile.imread(dng.parent / "ground_truth.tif")
    synth_s = time.perf_counter() - t0
    meta, mosaic, decode_s = decode(dng, work)
    win = detail_window(truth, cfg.crop_size) if first and cfg.crops else None
    run = ShotRun(shot, level, truth, win, cfg.crop_size)
    if win is not None:
        run.tiles["ground truth"] = run.tile(truth)
    score_packages(run, res, meta, mosaic, decode_s, methods, cfg)
    score_libraw(run, res, runner, dng, methods.libraw)
    if run.tiles:
        res.crop_tiles[level] = run.tiles
    done = [r for r in res.rows if r["shot"] == shot.name and r["level"] == level and r["psnr"] is not None]
    return (f"{level:>4} {shot.name:<20} synth {synth_s:5.1f}s  "
            + "  ".join(f"{r['method']} {r['psnr']:.2f}" for r in done))


def write_crops(crops_dir: Path, crop_tiles: dict[str, dict[str, np.ndarray]], summary: dict, labels: list[str],
                shot_name: str, zoom: int) -> dict[str, Path]:
    """One PNG strip per level: ground truth, the best LibRaw method, then every package."""
    crops: dict[str, Path] = {}
    for level, tiles in crop_tiles.items():
        best = summary["best_libraw"].get(level)
        order = [("ground truth", "ground truth")]
        if best is not None and best in tiles:
            order.append((f"LibRaw best: {best.removeprefix('libraw_')}", best))
        order += [(lab, lab) for lab in labels if lab not in LIBRAW_METHODS and lab in tiles]
        crops[level] = write_strip(Path(crops_dir) / f"crop_{level}_{shot_name}.png",
                                   [(name, tiles[key]) for name, key in order], zoom=zoom)
    return crops


def report_settings(cfg: RunConfig, levels: Sequence[str], shots: list[Shot], methods: Methods) -> dict:
    """The ``settings`` block of the report: everything needed to reproduce the run."""
    from lab.synth.unprocess import noise_level

    return {"camera": CAMERA, "space": SPACE, "scale": cfg.scale, "levels": list(levels),
            "noise_levels": {lv: vars(noise_level(lv)) for lv in levels},
            "shots": [vars(s) for s in shots], "border": BORDER,
            "ssim": {"sigma": SSIM_SIGMA, "truncate": SSIM_TRUNCATE, "k1": SSIM_K1, "k2": SSIM_K2,
                     "per_channel_mean": True},
            "libraw": {m: {"demosaic": d, "fbdd": f, "median_passes": n, "use_camera_wb": True,
                           "no_auto_bright": True, "output_color": "sRGB", "gamma": [2.4, 12.92],
                           "output_bps": 16, "user_flip": 0, "adjust_maximum_thr": 0.0}
                       for m, (d, f, n) in LIBRAW_METHODS.items() if m in methods.libraw},
            "packages": methods.packages, "sharpen_amount_override": cfg.sharpen_amount,
            "photos_dir": str(cfg.photos_dir) if cfg.photos_dir else None}


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
    artefacts: bool = False,
) -> dict:
    """Run the benchmark and return the report (settings, machine, per-shot rows, summary, notes).

    ``methods``: package names/paths (``classical_v1.strata``) and LibRaw names (:data:`LIBRAW_METHODS`);
    default: :data:`DEFAULT_PACKAGES` + every LibRaw method. A package that does not exist is skipped with a
    note. ``cache_dir`` keeps the synthetic DNGs between runs (default: a temporary directory);
    ``sharpen_amount`` overrides the pipeline's sharpen amount (diagnostic; None = as the workers render);
    ``artefacts``: the artefact benchmark's content (default) at every CFA phase, summarised per content
    (:mod:`lab.quality.artefacts`, the report's ``artefacts``).
    """
    import torch

    from lab.synth.unprocess import noise_level

    say = progress or (lambda _msg: None)
    res = Results(notes=[])
    cfg = RunConfig(scale, photos_dir, device or ("cuda" if torch.cuda.is_available() else "cpu"),
                    crops_dir is not None, crop_size, sharpen_amount)
    for level in levels:
        noise_level(level)  # validates
    chosen = select_methods(methods, res.notes)
    shots = select_shots(content, photos_dir, cfa, limit, res.notes, artefacts)
    for p in chosen.packages:
        warm_up(p, cfg.device)
    with tempfile.TemporaryDirectory(prefix="strata-quality-") as tmp, LibRawRunner() as runner:
        cache = Path(cache_dir) if cache_dir else Path(tmp) / "shots"
        cache.mkdir(parents=True, exist_ok=True)
        for level in levels:
            for k, shot in enumerate(shots):
                say(bench_shot(shot, level, k == 0, cache, Path(tmp), runner, chosen, cfg, res))
    summary = summarise(res.rows, levels, chosen.labels)
    crops = {} if crops_dir is None else write_crops(crops_dir, res.crop_tiles, summary, chosen.labels,
                                                     shots[0].name if shots else "", crop_zoom)
    return {
        "benchmark": "strata quality", "settings": report_settings(cfg, levels, shots, chosen),
        "machine": machine_info(cfg.device), "methods": chosen.labels, "skipped": chosen.skipped, "rows": res.rows,
        "summary": summary, "alignment": res.alignment, "colour_check": res.colour,
        "crops": {k: str(v) for k, v in crops.items()}, "notes": res.notes,
        **({"artefacts": summarise_artefacts(res.rows)} if artefacts else {}),
    }
