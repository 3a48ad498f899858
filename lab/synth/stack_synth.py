"""Synthetic multi-shot stacks with known ground truth, for the stack tests and the stack benchmark.

Built on :mod:`lab.synth.synth` (the dead-leaves scene, the unprocessing and the noise model) and
:func:`services.raw.dng.write_dng`. Each frame re-renders the scene on its own shifted sampling grid, so
sub-pixel shifts are exact. Shift convention as in ``synth``: ``frame_k(y, x) = frame_0(y - dy, x - dx)``.

Options:
- ``moving_object``: a flat-coloured disc sits in the scene (so it moves with the camera in every frame),
  except in one non-reference frame where it is displaced: ``motion_mask`` marks the reference-geometry
  pixels where that frame differs from the scene (the disc's place in the reference and its displaced place).
- ``walking``: with ``moving_object``, the disc moves in every frame instead (a walker: frame k holds it displaced
  by ``k / (frames - 1)`` of the offset, so the reference's place is seen by the reference alone and each other place
  by few frames); ``motion_mask`` marks every place it takes.
- ``pixel_shift``: four frames on the one-pixel pattern (0, 0), (0, 1), (1, 1), (1, 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.synth.synth import (
    COLOR_MATRIX,
    READ_NOISE_FACTOR,
    _content_frames,
    _to_raw,
    shot_size,
    unprocess,
    write_frame,
    write_ground_truth,
)
from services.raw.colour import CameraProfile, as_shot_neutral, camera_rgb_matrix
from services.raw.meta import CFA_PATTERNS, NoiseProfile

PIXEL_SHIFT_PATTERN: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.0, 1.0), (1.0, 1.0), (1.0, 0.0))
_OBJECT_COLOUR = np.array([0.85, 0.08, 0.05], dtype=np.float32)  # saturated red, linear sRGB
_OBJECT_MASK_MARGIN = 3.0  # px: the scene blur and the anti-aliased rim reach this far


@dataclass
class StackShot:
    """A synthetic stack: DNG files, ground truth of frame 0, per-frame shifts and the moving region."""

    files: list[Path]
    ground_truth: Path  # 16-bit sRGB TIFF of frame 0 (``ground_truth_linear.npy`` beside it)
    shifts: list[tuple[float, float]]
    motion_mask: np.ndarray  # [H, W] bool, reference geometry; all False without a moving object
    camera_rgb: np.ndarray  # [H, W, 3] float32 noise-free normalised camera RGB of frame 0 (pre-WB)


def _disc(height: int, width: int, cy: float, cx: float, r: float) -> np.ndarray:
    """Anti-aliased disc coverage [H, W] float32."""
    yy = (np.arange(height, dtype=np.float32) - np.float32(cy))[:, None] ** 2
    xx = (np.arange(width, dtype=np.float32) - np.float32(cx))[None, :] ** 2
    return np.clip(np.float32(r + 0.5) - np.sqrt(yy + xx), 0.0, 1.0)


def _camera_rgb(linear: np.ndarray) -> np.ndarray:
    """Linear sRGB [H, W, 3] -> normalised camera RGB [H, W, 3] (what a sensor site of each colour records)."""
    cam = camera_rgb_matrix(COLOR_MATRIX) * as_shot_neutral(COLOR_MATRIX)[:, None]  # [camera, srgb]
    return (linear.astype(np.float64) @ cam.T).astype(np.float32)


def _check_stack_args(cfa: str, noise: float, max_shift: float, frames: int, pixel_shift: bool) -> None:
    if cfa not in CFA_PATTERNS:
        raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {cfa!r}")
    if noise < 0 or max_shift < 0:
        raise ValueError(f"noise and max_shift must be >= 0, got {noise}, {max_shift}")
    if pixel_shift and frames != 4:
        raise ValueError(f"pixel-shift stacks have 4 frames, got {frames}")
    if not 2 <= frames <= 16:
        raise ValueError(f"a stack needs 2..16 frames, got {frames}")


@dataclass(frozen=True)
class _MovingObject:
    """A disc that sits at ``centre`` in every frame but ``moved_frame``, where it is displaced by ``offset``."""

    centre: np.ndarray  # (cy, cx) in frame-0 pixels
    offset: np.ndarray  # displacement in the moved frame
    radius: float
    moved_frame: int
    mask: np.ndarray  # (H, W) bool: every position (with a margin); all False without the object


    walking: bool = False  # displaced in every frame, k / (frames - 1) of the offset (see the module doc)

    def displacement(self, frame: int, frames: int) -> np.ndarray:
        """Where the object sits in ``frame`` relative to ``centre``."""
        if self.walking:
            return self.offset * (frame / (frames - 1))
        return self.offset if frame == self.moved_frame else np.zeros(2)


def _moving_object(rng: np.random.Generator, height: int, width: int, frames: int, present: bool,
                   walking: bool = False) -> _MovingObject:
    """The object's place (drawn whether or not it is shown, so the other random streams do not change)."""
    mask = np.zeros((height, width), dtype=bool)
    radius = max(0.06 * min(height, width), 3.0)
    centre = rng.uniform(0.3, 0.7, 2) * (height, width)
    angle = rng.uniform(0, 2 * math.pi)
    offset = 2.5 * radius * np.array([math.sin(angle), math.cos(angle)])
    thing = _MovingObject(centre, offset, radius, frames - 1, mask, walking)
    if present:
        places = range(frames) if walking else (0, frames - 1)
        for cy, cx in (centre + thing.displacement(k, frames) for k in places):
            yy = (np.arange(height) - cy)[:, None] ** 2
            xx = (np.arange(width) - cx)[None, :] ** 2
            mask |= np.sqrt(yy + xx) <= radius + _OBJECT_MASK_MARGIN
    return thing


def synthesize_stack(
    out_dir: Path,
    *,
    frames: int = 4,
    scale: float = 0.1,
    seed: int = 0,
    noise: float = 0.002,
    cfa: str = "RGGB",
    max_shift: float = 1.5,
    moving_object: bool = False,
    walking: bool = False,
    pixel_shift: bool = False,
    camera: str = "IQ2_XS",
    content: str = "dead_leaves",
    photos_dir: Path | str | None = None,
) -> StackShot:
    """Write ``frame_NN.dng`` + ground truth of a synthetic ``camera`` stack into ``out_dir``.

    ``frames`` 2..16 (4 in pixel-shift mode); random shifts uniform in [-max_shift, max_shift] (frame 0 at
    (0, 0)); ``noise`` is the shot coefficient of the NoiseProfile (read = 0.5 noise^2; 0 = noise-free).
    ``content``: ``dead_leaves`` (rendered exactly at each shift) or a photograph as in ``synth``
    (``photo:NNN``, ``skimage:NAME``, a path; Lanczos-resampled at each shift).
    """
    _check_stack_args(cfa, noise, max_shift, frames, pixel_shift)
    width, height = shot_size(camera, scale)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    scene_rng, shift_rng, noise_rng, object_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    if pixel_shift:
        shifts = list(PIXEL_SHIFT_PATTERN)
    else:
        shifts = [(0.0, 0.0)] + [
            (float(dy), float(dx)) for dy, dx in shift_rng.uniform(-max_shift, max_shift, (frames - 1, 2))
        ]
    thing = _moving_object(object_rng, height, width, frames, moving_object, walking)
    noise_profile = NoiseProfile(shot=noise, read=READ_NOISE_FACTOR * noise**2)
    files: list[Path] = []
    ground_truth = out_dir / "ground_truth.tif"
    camera_rgb = np.zeros((height, width, 3), np.float32)
    linear_frames = _content_frames(content, height, width, shifts, scene_rng, photos_dir)
    for k, ((dy, dx), linear) in enumerate(zip(shifts, linear_frames, strict=True)):
        if moving_object:
            cy, cx = thing.centre + thing.displacement(k, frames)
            alpha = _disc(height, width, cy + dy, cx + dx, thing.radius)[..., None]  # [H, W, 1]
            linear = linear + alpha * (_OBJECT_COLOUR - linear)
        if k == 0:
            ground_truth = write_ground_truth(linear, out_dir)
            camera_rgb = _camera_rgb(linear)
        raw = _to_raw(unprocess(linear, cfa), noise, noise_rng)
        path = out_dir / f"frame_{k:02d}.dng"
        write_frame(path, raw, cfa=cfa, camera=camera, profile=CameraProfile(COLOR_MATRIX),
                    neutral=as_shot_neutral(COLOR_MATRIX).tolist(), noise_profile=noise_profile)
        files.append(path)
    return StackShot(files=files, ground_truth=ground_truth, shifts=shifts, motion_mask=thing.mask,
                     camera_rgb=camera_rgb)
