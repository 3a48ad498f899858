"""JPEG and PNG output, with the space's ICC profile, the shot's EXIF and the recipe's resolution.

JPEG: Pillow (8-bit, the quality of the recipe, EXIF + ICC in their APP segments, JFIF density = ppi).
PNG: imagecodecs encodes the pixels (8 or 16 bits per channel: Pillow has no 48-bit RGB), pypng places the
iCCP, pHYs and eXIf chunks in front of the image data (the EXIF block is Pillow's).
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import BinaryIO

import imagecodecs
import numpy as np
import png
from PIL import Image

from services.export.icc import icc_profile
from services.export.metadata import OutputMetadata, pillow_exif
from services.export.tiff import write_hashed
from services.raw.colour import output_space
from services.storage.base import Storage

EXIF_HEADER = b"Exif\x00\x00"
INCH_M = 0.0254


def _check(rgb: np.ndarray, dtypes: tuple[type, ...]) -> None:
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype not in dtypes:
        raise ValueError(f"expected (H, W, 3) {' or '.join(np.dtype(d).name for d in dtypes)}, got "
                         f"{rgb.shape} {rgb.dtype}")


def write_jpeg(storage: Storage, key: str, rgb: np.ndarray, *, colour_space: str, quality: int,
               meta: OutputMetadata) -> tuple[str, int]:
    """Write (H, W, 3) uint8 codes as a baseline JPEG to ``key`` atomically; returns (sha256, bytes)."""
    _check(rgb, (np.uint8,))
    image = Image.fromarray(np.ascontiguousarray(rgb), "RGB")

    def encode(f: BinaryIO) -> None:
        image.save(f, "JPEG", quality=int(quality), icc_profile=icc_profile(colour_space),
                   exif=pillow_exif(meta, colour_space, image.size).tobytes(), dpi=(meta.ppi, meta.ppi),
                   optimize=False)

    return write_hashed(storage, key, encode)


def _png_chunks(meta: OutputMetadata, colour_space: str) -> list[tuple[bytes, bytes]]:
    """iCCP (profile name, deflate method 0, compressed profile), pHYs (pixels per metre) and eXIf."""
    name = output_space(colour_space).description.encode("latin-1", "replace")[:79]
    per_metre = round(meta.ppi / INCH_M)
    exif = pillow_exif(meta, colour_space).tobytes()
    return [
        (b"iCCP", name + b"\x00\x00" + zlib.compress(icc_profile(colour_space), 9)),
        (b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
        (b"eXIf", exif[len(EXIF_HEADER):] if exif.startswith(EXIF_HEADER) else exif),
    ]


def write_png(storage: Storage, key: str, rgb: np.ndarray, *, colour_space: str, meta: OutputMetadata,
              level: int = 6) -> tuple[str, int]:
    """Write (H, W, 3) uint16 or uint8 codes as a PNG to ``key`` atomically; returns (sha256, bytes)."""
    _check(rgb, (np.uint16, np.uint8))
    encoded = imagecodecs.png_encode(np.ascontiguousarray(rgb), level=level)
    chunks = list(png.Reader(bytes=encoded).chunks())
    extra = _png_chunks(meta, colour_space)
    ordered = chunks[:1] + extra + chunks[1:]  # right after IHDR: before any IDAT

    def encode(f: BinaryIO) -> None:
        buffer = io.BytesIO()
        png.write_chunks(buffer, ordered)
        f.write(buffer.getbuffer())

    return write_hashed(storage, key, encode)
