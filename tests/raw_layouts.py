"""DNGs of sensor layouts Strata refuses or renders specially, written with the project's DNG tags (tifffile):
X-Trans-like (6x6 CFA), CMYG 2x2, monochrome, and a plain linear DNG, each a real file LibRaw opens; and images
smaller than LibRaw reads (it refuses them as "Unsupported file format")."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import imagecodecs
import numpy as np
import tifffile

from services.raw.colour import CameraProfile
from services.raw.dng import (
    PHOTOMETRIC_CFA,
    PHOTOMETRIC_LINEAR_RAW,
    TAG_CFA_LAYOUT,
    TAG_CFA_PATTERN,
    TAG_CFA_PLANE_COLOR,
    TAG_CFA_REPEAT_PATTERN_DIM,
    TagTuple,
    dng_tags,
    write_linear_dng,
)
from tests.ljpeg import ljpeg_encode

PROFILE = CameraProfile(((0.9, -0.3, -0.1), (-0.4, 1.3, 0.1), (-0.1, 0.2, 0.7)))
_CFA_CODES = (TAG_CFA_REPEAT_PATTERN_DIM, TAG_CFA_PATTERN, TAG_CFA_PLANE_COLOR, TAG_CFA_LAYOUT)
# Fujifilm's X-Trans pattern (0 R, 1 G, 2 B), 6x6.
XTRANS = (1, 1, 0, 1, 1, 2,
          1, 1, 2, 1, 1, 0,
          2, 0, 1, 0, 2, 1,
          1, 1, 2, 1, 1, 0,
          1, 1, 0, 1, 1, 2,
          0, 2, 1, 2, 0, 1)


def _tags(cfa: list[TagTuple]) -> list[TagTuple]:
    base = dng_tags(cfa="RGGB", black_level=256, white_level=16383, profile=PROFILE, as_shot_neutral=(0.5, 1, 0.7),
                    make="Acme", model="Odd Sensor", noise_profile=None)
    return [t for t in base if t[0] not in _CFA_CODES] + cfa


def _tiff(data: np.ndarray, photometric: int, tags: list[TagTuple], compression: str | None = None) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, data, photometric=photometric, planarconfig="contig", subfiletype=0, software=False,
                     metadata=None, extratags=tags, compression=compression)
    return buf.getvalue()


def _mosaic(h: int = 48, w: int = 72, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(256, 16000, (h, w), dtype=np.uint16)


def xtrans_dng() -> bytes:
    """A 6x6 X-Trans CFA DNG (CFARepeatPatternDim 6x6)."""
    return _tiff(_mosaic(), PHOTOMETRIC_CFA, _tags([
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (6, 6), True), (TAG_CFA_PATTERN, "B", 36, XTRANS, True),
        (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True), (TAG_CFA_LAYOUT, "H", 1, 1, True)]))


def cmyg_dng() -> bytes:
    """A 2x2 CMYG CFA DNG (CFAPlaneColor cyan, magenta, yellow, green)."""
    return _tiff(_mosaic(), PHOTOMETRIC_CFA, _tags([
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (2, 2), True), (TAG_CFA_PATTERN, "B", 4, (0, 1, 2, 3), True),
        (TAG_CFA_PLANE_COLOR, "B", 4, (3, 4, 5, 1), True), (TAG_CFA_LAYOUT, "H", 1, 1, True)]))


def quad_dng() -> bytes:
    """A 4x4 RGB CFA DNG ("quad Bayer"-like)."""
    pattern = tuple(int("RGB".index(c)) for c in "RRGGRRGGGGBBGGBB")
    return _tiff(_mosaic(), PHOTOMETRIC_CFA, _tags([
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (4, 4), True), (TAG_CFA_PATTERN, "B", 16, pattern, True),
        (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True)]))


def side_greens_dng() -> bytes:
    """A 2x2 RGB CFA that is not Bayer: R G / B G (both greens in one column)."""
    return _tiff(_mosaic(), PHOTOMETRIC_CFA, _tags([
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (2, 2), True), (TAG_CFA_PATTERN, "B", 4, (0, 1, 2, 1), True),
        (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True)]))


def monochrome_dng() -> bytes:
    """A monochrome DNG: one sample per pixel, Photometric BlackIsZero, DNG tags, no CFA."""
    return _tiff(_mosaic(), 1, _tags([]))


def monochrome_linear_dng() -> bytes:
    """A LinearRaw DNG with one sample per pixel (how some monochrome backs write theirs): tifffile refuses to
    write LinearRaw with one sample, so a BlackIsZero file gets its PhotometricInterpretation patched."""
    data = bytearray(monochrome_dng())
    with tifffile.TiffFile(io.BytesIO(bytes(data))) as tif:
        at = tif.pages.first.tags[262].valueoffset
    data[at : at + 2] = (34892).to_bytes(2, "little")
    return bytes(data)


def float_linear_dng() -> bytes:
    """A floating-point (SampleFormat IEEE float, one per sample) 3-sample LinearRaw DNG (an HDR merge's)."""
    return _tiff(np.random.default_rng(5).random((48, 72, 3), dtype=np.float32), 34892, _tags([]))


def _linear_image(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(4).integers(256, 16000, (h, w, 3), dtype=np.uint16)


def linear_dng(h: int = 48, w: int = 72) -> bytes:
    """A small 3-sample LinearRaw DNG (random content), through the project's writer."""
    import tempfile
    from pathlib import Path

    image = _linear_image(h, w)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "linear.dng"
        write_linear_dng(path, image, black_level=256, white_level=16383, profile=PROFILE,
                         as_shot_neutral=(0.5, 1.0, 0.7), make="Acme", model="Converter")
        return path.read_bytes()


def bayer_dng(h: int = 48, w: int = 72, pattern: str = "RGGB", compression: str | None = None,
              seed: int = 3) -> bytes:
    """A Bayer DNG of the given size and 2x2 pattern (random content from ``seed``); ``compression`` as tifffile
    names it ("zlib", "lzw", "zstd": codes the DNG specification does not allow for integer raw data)."""
    return _tiff(_mosaic(h, w, seed), PHOTOMETRIC_CFA, _tags([
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (2, 2), True),
        (TAG_CFA_PATTERN, "B", 4, tuple("RGB".index(c) for c in pattern), True),
        (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True)]), compression)


def _tiled_ljpeg(data: np.ndarray, photometric: int, tags: list[TagTuple], tile: int,
                 encode: Callable[[np.ndarray], bytes]) -> bytes:
    """``data`` (H, W) or (H, W, 3) as lossless JPEG (Compression 7) in ``tile`` x ``tile`` tiles, edge tiles
    padded, as DNG converters write raw data."""
    h, w = data.shape[:2]

    def tiles() -> Iterator[bytes]:
        for y in range(0, h, tile):
            for x in range(0, w, tile):
                padded = np.zeros((tile, tile, *data.shape[2:]), dtype=np.uint16)
                part = data[y: y + tile, x: x + tile]
                padded[: part.shape[0], : part.shape[1]] = part
                yield encode(padded)

    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as tif:
        tif.write(tiles(), shape=data.shape, dtype=np.uint16, photometric=photometric, planarconfig="contig",
                  compression=7, tile=(tile, tile), subfiletype=0, software=False, metadata=None, extratags=tags)
    return buf.getvalue()


def lossless_jpeg_dng(h: int = 48, w: int = 72, tile: int = 64, seed: int = 3) -> bytes:
    """:func:`bayer_dng`'s mosaic (same ``seed``, RGGB) as lossless-JPEG tiles (imagecodecs' encoder, 16 bits)."""
    return _tiled_ljpeg(_mosaic(h, w, seed), PHOTOMETRIC_CFA, _tags([
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (2, 2), True), (TAG_CFA_PATTERN, "B", 4, (0, 1, 1, 2), True),
        (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True)]), tile, lambda t: imagecodecs.ljpeg_encode(t, bitspersample=16))


def lossless_jpeg_linear_dng(h: int = 48, w: int = 72, tile: int = 64) -> bytes:
    """:func:`linear_dng`'s image as lossless-JPEG tiles of three interleaved components (:mod:`tests.ljpeg`), as
    DNG converters write linear DNGs."""
    tags = dng_tags(cfa="", black_level=256, white_level=16383, profile=PROFILE, as_shot_neutral=(0.5, 1.0, 0.7),
                    make="Acme", model="Converter", noise_profile=None)
    return _tiled_ljpeg(_linear_image(h, w), PHOTOMETRIC_LINEAR_RAW, tags, tile, ljpeg_encode)


def narrow_dng() -> bytes:
    """A Bayer DNG 21 pixels wide: one below the smallest raw image LibRaw reads (it reads 22 x 22)."""
    return bayer_dng(48, 21)


# name -> (writer, a phrase the 422's reason must hold)
REFUSED: dict[str, tuple[Callable[[], bytes], str]] = {
    "x-trans": (xtrans_dng, "X-Trans 6x6 CFA is not supported"),
    "cmyg": (cmyg_dng, "2x2 CMYG CFA"),
    "4x4 cfa": (quad_dng, "4x4 CFA"),
    "2x2 not bayer": (side_greens_dng, "2x2 CFA pattern RGBG (not a Bayer pattern)"),
    "monochrome": (monochrome_dng, "monochrome DNG"),
    "monochrome linear": (monochrome_linear_dng, "monochrome linear DNG"),
    "floating point": (float_linear_dng, "floating-point DNG"),
    "too narrow": (narrow_dng, "a 21 x 48 pixel raw image (LibRaw reads at least 22 x 22)"),
    "tiny linear": (lambda: linear_dng(5, 7), "a 7 x 5 pixel raw image"),
}
