"""Pure image operations over torch tensors (no I/O, no global device); shapes are documented per function."""

from services.pipeline.ops.align import estimate_shift
from services.pipeline.ops.cfa import CFA_PATTERNS, cfa_channels, cfa_masks
from services.pipeline.ops.colour import (
    apply_matrix,
    clip_highlights,
    decode_transfer,
    encode_transfer,
    srgb_decode,
    srgb_encode,
    to_uint16,
    white_balance,
    white_balance_rgb,
)
from services.pipeline.ops.demosaic import BILINEAR_RADIUS, MALVAR_RADIUS, demosaic_bilinear, demosaic_malvar
from services.pipeline.ops.denoise import denoise_lee
from services.pipeline.ops.levels import normalize_levels, normalize_linear
from services.pipeline.ops.merge import accumulate_frames, shift_mosaic
from services.pipeline.ops.sharpen import sharpen, sharpen_radius
from services.raw.colour import SRGB_TO_XYZ_D65, camera_to_srgb_matrix  # the colour model, re-exported for callers

__all__ = [
    "BILINEAR_RADIUS",
    "CFA_PATTERNS",
    "MALVAR_RADIUS",
    "SRGB_TO_XYZ_D65",
    "accumulate_frames",
    "apply_matrix",
    "camera_to_srgb_matrix",
    "cfa_channels",
    "clip_highlights",
    "cfa_masks",
    "decode_transfer",
    "demosaic_bilinear",
    "demosaic_malvar",
    "denoise_lee",
    "encode_transfer",
    "estimate_shift",
    "normalize_levels",
    "normalize_linear",
    "sharpen",
    "sharpen_radius",
    "shift_mosaic",
    "srgb_decode",
    "srgb_encode",
    "to_uint16",
    "white_balance",
    "white_balance_rgb",
]
