"""A fast path for uncompressed Bayer DNGs (the capture backs' own files): the mosaic is read straight from the
file's strip or tile bytes, memory-mapped, without LibRaw's copies and without a child process.

Only the plainest layout takes it: one CFA raw IFD, 16-bit, uncompressed, one contiguous block of data, a 2x2
RGB pattern, no linearization table or opcode lists, and the colour and level tags the render needs stated in
the file. Everything else (compressed or non-DNG files, odd layouts) returns None and goes to LibRaw in its
sandboxed child (:func:`services.raw.decode.decode_raw`). The result equals the child's for the same file (the
visible area is the DNG ActiveArea, as LibRaw crops it; tests/unit/test_raw_fast_dng.py compares the two).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import tifffile

from services.raw.colour import CameraProfile
from services.raw.dng import PHOTOMETRIC_CFA, TAG_DNG_VERSION, read_capture_info, read_dng_tags
from services.raw.meta import CFA_PATTERNS, CaptureInfo, NoiseProfile, RawMeta

TAG_CFA_REPEAT_PATTERN_DIM = 33421
TAG_CFA_PATTERN = 33422
TAG_CFA_PLANE_COLOR = 50710
TAG_LINEARIZATION_TABLE = 50712
TAG_ACTIVE_AREA = 50829
_OPCODE_LISTS = (51008, 51009, 51022)
_BLACK_DELTAS = (50715, 50716)  # BlackLevelDeltaH/V: LibRaw's path applies them (services/raw/corrections.py)
_COLOURS = "RGB"
_BAND_BYTES = 1 << 21  # bytes of mosaic per band of the copy (without a binner)
LIBRAW_MIN_SIDE = 22  # LibRaw refuses smaller images; so does this path (the same answer for every file)


def _raw_page(tif: tifffile.TiffFile) -> tifffile.TiffPage | None:
    ifd0 = tif.pages.first
    if TAG_DNG_VERSION not in ifd0.tags:
        return None
    candidates = [ifd0]
    if ifd0.pages is not None:
        candidates += [p for p in ifd0.pages if isinstance(p, tifffile.TiffPage)]
    raws = [p for p in candidates if int(p.photometric) == PHOTOMETRIC_CFA and int(p.subfiletype) == 0]
    return raws[0] if len(raws) == 1 else None


def _plain(page: tifffile.TiffPage) -> bool:
    """16-bit, one sample, uncompressed, contiguous, 2x2 RGB CFA, no linearization, black deltas or opcodes (the
    LibRaw path applies what of those the render needs)."""
    tags = page.tags
    plane = tags.get(TAG_CFA_PLANE_COLOR)
    return (page.compression == 1 and page.bitspersample == 16 and page.samplesperpixel == 1
            and bool(page.is_contiguous) and len(page.shape) == 2
            and tuple(tags.valueof(TAG_CFA_REPEAT_PATTERN_DIM) or ()) == (2, 2)
            and (plane is None or tuple(plane.value) == (0, 1, 2))
            and TAG_LINEARIZATION_TABLE not in tags and not any(code in tags for code in _OPCODE_LISTS)
            and not any(code in tags for code in _BLACK_DELTAS))


def _active_area(page: tifffile.TiffPage) -> tuple[int, int, int, int]:
    h, w = page.shape
    area = page.tags.valueof(TAG_ACTIVE_AREA)
    if area is None:
        return 0, 0, h, w
    top, left, bottom, right = (int(v) for v in area)
    if not (0 <= top < bottom <= h and 0 <= left < right <= w) or top % 2 or left % 2:
        raise ValueError(f"ActiveArea {area}: outside the {w}x{h} raw image or at an odd origin (LibRaw's case)")
    return top, left, bottom, right


def _cfa(page: tifffile.TiffPage, top: int, left: int) -> str | None:
    pattern = page.tags.valueof(TAG_CFA_PATTERN)
    if pattern is None or len(pattern) != 4 or any(int(c) > 2 for c in pattern):
        return None
    sites = [int(pattern[((y + top) % 2) * 2 + (x + left) % 2]) for y in (0, 1) for x in (0, 1)]
    cfa = "".join(_COLOURS[c] for c in sites)
    return cfa if cfa in CFA_PATTERNS else None


def _site_blacks(tags: dict[str, Any], top: int, left: int) -> tuple[float, float, float, float] | None:
    rows, cols = tags["black_level_repeat"]
    values = tags["black_level"]
    if rows not in (1, 2) or cols not in (1, 2) or len(values) != rows * cols:
        return None
    area_top, area_left = tags["active_area_origin"]
    site = [values[((y + top - area_top) % rows) * cols + (x + left - area_left) % cols] for y in (0, 1)
            for x in (0, 1)]
    return (site[0], site[1], site[2], site[3])


def _matrix9(values: list[float] | None) -> tuple[tuple[float, float, float], ...] | None:
    if values is None or len(values) != 9:
        return None
    return tuple((values[i], values[i + 1], values[i + 2]) for i in (0, 3, 6))


def _meta(tags: dict[str, Any], cfa: str, blacks: tuple[float, float, float, float], height: int,
          width: int, capture: CaptureInfo) -> RawMeta | None:
    """RawMeta from the DNG's tags, as the LibRaw child would report it; None if a tag the render needs (or
    that the child would take from LibRaw instead) is missing."""
    cm = _matrix9(tags["color_matrix"])
    neutral, white_xy = tags["as_shot_neutral"], tags["as_shot_white_xy"]
    if cm is None or tags["white_level"] is None or (neutral is None and white_xy is None):
        return None
    balance = tags["analog_balance"]
    profile = CameraProfile(
        color_matrix_1=cm, color_matrix_2=_matrix9(tags["color_matrix_2"]),
        illuminant_1=tags["calibration_illuminants"][0], illuminant_2=tags["calibration_illuminants"][1],
        forward_matrix_1=_matrix9(tags["forward_matrix_1"]), forward_matrix_2=_matrix9(tags["forward_matrix_2"]),
        camera_calibration_1=_matrix9(tags["camera_calibration_1"]),
        camera_calibration_2=_matrix9(tags["camera_calibration_2"]),
        analog_balance=tuple(balance[:3]) if balance is not None and len(balance) >= 3 else None,
    )
    noise = tags["noise_profile"]
    return RawMeta(
        width=width, height=height, cfa=cfa, black_levels=blacks, white_level=float(tags["white_level"]),
        profile=profile,
        as_shot_neutral=None if neutral is None or len(neutral) < 3 else (neutral[0], neutral[1], neutral[2]),
        make=tags["make"], model=tags["model"],
        noise_profile=None if noise is None or len(noise) < 2 else NoiseProfile(shot=noise[0], read=noise[1]),
        as_shot_white_xy=None if white_xy is None or len(white_xy) < 2 else (white_xy[0], white_xy[1]),
        baseline_exposure=float(tags["baseline_exposure"]),
        capture=capture,
    )


def _capture(path: Path, tags: dict[str, Any]) -> CaptureInfo:
    """The capture tags of the file (the LibRaw child also fills fields a file lacks from maker notes LibRaw
    reads; a capture back's DNG states them as tags)."""
    info = read_capture_info(path) or CaptureInfo()
    return replace(info, make=info.make or tags["make"], model=info.model or tags["model"])


class BandSink(Protocol):
    """Something fed the mosaic band by band as the decoder copies it (the fast preview's binner,
    :class:`services.pipeline.preview.MosaicBinner`): sized by ``start``, each band begins at a multiple of
    ``band_rows`` rows, ``finish`` once the whole frame went through."""

    def start(self, height: int, width: int) -> None: ...

    def band_rows(self, width: int, itemsize: int = 2) -> int: ...

    def add(self, row0: int, rows: np.ndarray) -> None: ...

    def finish(self) -> None: ...


def _write_bands(src: np.ndarray, path: Path, threads: int, binner: BandSink | None) -> None:
    """Write ``src`` (rows of the file's mapped raw data) as a uint16 ``.npy`` at ``path``: in bands of rows on
    ``threads`` threads, each band written with ``pwrite`` (no page faults on a fresh memory map: about half the
    time on the dev VM) and binned for the preview right after, while it is in cache. A band that is not one
    contiguous block of the file (an ActiveArea narrower than the image, a big-endian file) is copied (and
    byte-swapped) on the way."""
    height, width = src.shape
    step = binner.band_rows(width) if binner is not None else max(1, _BAND_BYTES // (2 * width))
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<u2", "fortran_order": False, "shape": (height, width)})
        offset = f.tell()
        f.truncate(offset + height * width * 2)
        fd = f.fileno()

        def band(r0: int) -> None:
            rows = np.ascontiguousarray(src[r0 : r0 + step], dtype="<u2")
            written, data = 0, rows.data.cast("B")
            while written < len(data):  # pwrite may write less than asked
                written += os.pwrite(fd, data[written:], offset + r0 * width * 2 + written)
            if binner is not None:
                binner.add(r0, rows)

        if threads <= 1 or height <= step:
            for r0 in range(0, height, step):
                band(r0)
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="strata-decode") as pool:
                list(pool.map(band, range(0, height, step)))


def decode_fast(path: Path, out_npy: Path, *, threads: int = 1, binner: BandSink | None = None
                ) -> RawMeta | None:
    """Write the visible mosaic of an uncompressed Bayer DNG to ``out_npy`` (uint16 ``.npy``) and return its
    metadata; None (nothing written) when the file needs LibRaw.

    The copy goes in bands of rows on ``threads`` threads (:func:`_write_bands`); a ``binner`` (the fast
    preview's: :class:`BandSink`) is fed each band right after its copy, while the
    band is in cache, and is ``ready`` when the whole frame went through it."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) not in (b"II*\x00", b"MM\x00*"):
            return None
    try:
        with tifffile.TiffFile(path) as tif:
            page = _raw_page(tif)
            if page is None or not _plain(page):
                return None
            offset, count = int(page.dataoffsets[0]), int(sum(page.databytecounts))
            rows, cols = page.shape
            if count != rows * cols * 2 or offset + count > os.path.getsize(path):
                return None
            top, left, bottom, right = _active_area(page)
            if min(bottom - top, right - left) < LIBRAW_MIN_SIDE:
                return None
            cfa = _cfa(page, top, left)
            dtype = np.dtype(f"{tif.byteorder}u2")
    except Exception:  # noqa: BLE001 - anything odd about the file: LibRaw decides (and reports) instead
        return None
    try:
        tags = read_dng_tags(path)
        blacks = None if tags is None or cfa is None else _site_blacks(tags, top, left)
        meta = None if tags is None or cfa is None or blacks is None else _meta(
            tags, cfa, blacks, bottom - top, right - left, _capture(path, tags))
    except Exception:  # noqa: BLE001 - malformed tags (a corrupt file): the LibRaw child decides and reports
        return None
    if meta is None:
        return None
    raw = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(rows, cols))
    part = out_npy.with_name(out_npy.name + ".part")
    if binner is not None:
        binner.start(bottom - top, right - left)
    _write_bands(raw[top:bottom, left:right], part, threads, binner)
    del raw
    os.replace(part, out_npy)
    if binner is not None:
        binner.finish()
    return meta
