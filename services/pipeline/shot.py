"""Shot-level parameters, computed once per shot and shared by every shard: white balance, noise, colour.

The colour model and the white-balance decision (as-shot white, else grey world) are
:mod:`services.raw.colour`'s; this module turns them into the shards' :class:`RenderParams`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.pipeline.models.architectures import post_sharpen
from services.pipeline.models.registry import default_package, package_manifest, package_ref, tier_orientations
from services.pipeline.render import LINEAR_SHARPEN, RenderParams, SpaceColour
from services.raw.colour import cfa_planes, render_colour, white_balance_neutral
from services.raw.meta import RawMeta, snr_db


def estimate_noise(meta: RawMeta, mosaic: np.ndarray) -> tuple[float, float]:
    """Noise model (shot, read) in normalised units: the file's NoiseProfile, else a robust estimate.

    The estimate is a signal-independent variance from the median absolute difference of horizontally
    adjacent same-colour sites of the green plane (robust to edges); in a linear image, of green pixels two
    columns apart (as in a mosaic: a converter's demosaic correlates neighbours).
    """
    if meta.noise_profile is not None:
        return (float(meta.noise_profile.shot), float(meta.noise_profile.read))
    rows = mosaic[: min(mosaic.shape[0], 2048)]
    plane = cfa_planes(rows, meta)["G"][0]
    if meta.is_linear:
        plane = plane[:, ::2]
    diff = np.abs(np.diff(plane, axis=1))
    sigma = 1.4826 * float(np.median(diff)) / np.sqrt(2.0)
    return (0.0, sigma * sigma)


def shot_render_params(meta: RawMeta, mosaic: np.ndarray, space: str = "srgb", camera: str = "IQ3_S",
                       model: str | None = None, extra_spaces: Sequence[str] = (),
                       tier: str | None = None) -> RenderParams:
    """The parameters every shard of this shot renders with (computed once, on the reference frame).

    Colour follows the DNG specification (services/raw/colour.py): white balance from AsShotNeutral (or
    AsShotWhiteXY, or a grey-world estimate when the file has neither), camera to XYZ D50 to ``space``.
    The model package is chosen here, once, so every shard of the shot renders with the same one: ``model``, else
    the camera's default of ``tier`` (best | fast | max; None: the setting; ``max``, and ``best`` on a clean shot, also
    set the self-ensemble: :func:`~services.pipeline.models.registry.tier_orientations`).
    ``extra_spaces``: further output spaces the shards also produce (each its matrix and transfer, computed
    here once; the white and so the gains do not depend on the space).
    """
    shot, read = estimate_noise(meta, mosaic)
    package = model or package_ref(default_package(camera, tier))
    orientations = 1 if meta.is_linear or model else tier_orientations(tier, package, snr_db(shot, read))
    neutral = white_balance_neutral(meta, mosaic)
    colour = render_colour(meta, space, neutral=neutral)
    extras = []
    for name in dict.fromkeys(s for s in extra_spaces if s != space):
        other = render_colour(meta, name, neutral=neutral)
        extras.append(SpaceColour(name, tuple(tuple(float(v) for v in row) for row in other.out_from_wb_cam),
                                  other.transfer))
    return RenderParams(
        cfa=meta.cfa,
        black=tuple(float(b) for b in meta.black_levels),  # type: ignore[arg-type]
        white=float(meta.white_level),
        gains=tuple(float(g) for g in colour.gains),  # type: ignore[arg-type]
        rgb_cam=tuple(tuple(float(v) for v in row) for row in colour.out_from_wb_cam),
        noise_shot=shot,
        noise_read=read,
        transfer=colour.transfer,
        camera=camera,
        model=package,
        sharpen_amount=LINEAR_SHARPEN if meta.is_linear else post_sharpen(package_manifest(package)),
        space=space,
        extra_spaces=tuple(extras),
        layout=meta.layout,
        orientations=orientations,
    )
