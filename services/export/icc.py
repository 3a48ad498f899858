"""A small ICC v2 matrix/TRC RGB display profile builder for the output spaces Pillow does not ship.

The profile holds rXYZ/gXYZ/bXYZ (primaries Bradford-adapted to the D50 PCS), wtpt (D50), rTRC/gTRC/bTRC
(``curv``: one gamma value, or a 4096-entry table for piecewise curves, or none for linear), desc and cprt.
The matrices come from :mod:`services.raw.colour` and the curves from :mod:`services.pipeline.ops.colour`, so
the profile describes exactly what the renderer wrote.
"""

from __future__ import annotations

import struct
from functools import lru_cache

import numpy as np
import torch

from services.pipeline.ops.colour import decode_transfer
from services.raw.colour import (
    ADOBE_RGB_GAMMA,
    WHITE_D50,
    bradford_matrix,
    output_space,
    rgb_to_xyz_matrix,
    xy_to_xyz,
)

ICC_D50 = (0.9642, 1.0, 0.8249)  # the ICC PCS illuminant
_TABLE_SIZE = 4096


def _s15f16(values: np.ndarray | tuple[float, ...]) -> bytes:
    return b"".join(struct.pack(">i", int(round(float(v) * 65536.0))) for v in values)


def _xyz_tag(xyz: np.ndarray | tuple[float, ...]) -> bytes:
    return b"XYZ " + b"\0" * 4 + _s15f16(xyz)


def _curve_tag(transfer: str) -> bytes:
    if transfer == "linear":
        return b"curv" + b"\0" * 4 + struct.pack(">I", 0)  # identity
    if transfer == "adobergb":
        return b"curv" + b"\0" * 4 + struct.pack(">IH", 1, int(round(ADOBE_RGB_GAMMA * 256)))  # u8Fixed8 563
    codes = torch.linspace(0.0, 1.0, _TABLE_SIZE, dtype=torch.float64)
    table = np.rint(decode_transfer(codes, transfer).numpy() * 65535.0).astype(">u2")
    return b"curv" + b"\0" * 4 + struct.pack(">I", _TABLE_SIZE) + table.tobytes()


def _desc_tag(text: str) -> bytes:
    ascii_text = text.encode("ascii") + b"\0"
    return (b"desc" + b"\0" * 4 + struct.pack(">I", len(ascii_text)) + ascii_text
            + struct.pack(">II", 0, 0) + struct.pack(">HB", 0, 0) + b"\0" * 67)


def _text_tag(text: str) -> bytes:
    return b"text" + b"\0" * 4 + text.encode("ascii") + b"\0"


def d50_primaries(space: str) -> np.ndarray:
    """Columns: XYZ of the space's R, G, B Bradford-adapted to D50, scaled so R + G + B = the ICC D50, (3, 3)."""
    m = bradford_matrix(output_space(space).white, WHITE_D50) @ rgb_to_xyz_matrix(space)
    return np.diag(np.asarray(ICC_D50) / xy_to_xyz(WHITE_D50)) @ m


def build_icc_profile(space: str, description: str | None = None) -> bytes:
    """ICC v2 RGB display profile bytes for an :data:`~services.raw.colour.OUTPUT_SPACES` entry."""
    out = output_space(space)
    prim = d50_primaries(space)
    curve = _curve_tag(out.transfer)
    tags: list[tuple[bytes, bytes]] = [
        (b"desc", _desc_tag(description or f"Strata {out.description}")),
        (b"cprt", _text_tag("No copyright, use freely")),
        (b"wtpt", _xyz_tag(ICC_D50)),
        (b"rXYZ", _xyz_tag(prim[:, 0])),
        (b"gXYZ", _xyz_tag(prim[:, 1])),
        (b"bXYZ", _xyz_tag(prim[:, 2])),
        (b"rTRC", curve),
        (b"gTRC", curve),
        (b"bTRC", curve),
    ]
    table_size = 4 + 12 * len(tags)
    offset = 128 + table_size
    entries, blobs, placed = [], [], {}  # identical curves share one blob
    for sig, data in tags:
        if data not in placed:
            placed[data] = offset
            padded = data + b"\0" * (-len(data) % 4)
            blobs.append(padded)
            offset += len(padded)
        entries.append(struct.pack(">4sII", sig, placed[data], len(data)))
    body = struct.pack(">I", len(tags)) + b"".join(entries) + b"".join(blobs)
    size = 128 + len(body)
    header = (
        struct.pack(">I", size) + b"\0" * 4 + struct.pack(">I", 0x02100000) + b"mntr" + b"RGB " + b"XYZ "
        + struct.pack(">6H", 2024, 1, 1, 0, 0, 0) + b"acsp" + b"\0" * 4 + struct.pack(">I", 0)
        + b"\0" * 8 + b"\0" * 8 + struct.pack(">I", 0) + _s15f16(ICC_D50) + b"\0" * 4 + b"\0" * 16 + b"\0" * 28
    )
    assert len(header) == 128
    return header + body


@lru_cache(maxsize=8)
def icc_profile(colour_space: str) -> bytes:
    """The ICC profile embedded for an output space: our v2 builder for every space, sRGB included (lcms' own
    sRGB carries its creation time, so a file's bytes would change from one process to the next)."""
    return build_icc_profile(colour_space)  # ValueError for an unknown space
