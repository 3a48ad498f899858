"""Cheap, safe RAW sniffing for the API process: magic bytes and TIFF structure only, never LibRaw."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import tifffile

from services.errors import BadRawFile, UnsupportedSensor
from services.raw.dng import (
    TAG_ACTIVE_AREA,
    TAG_BLACK_LEVEL,
    TAG_COLOR_MATRIX_1,
    TAG_COLOR_MATRIX_2,
    TAG_WHITE_LEVEL,
    find_tag,
    tag_floats,
)

PHOTOMETRIC_CFA = 32803
PHOTOMETRIC_LINEAR_RAW = 34892
PHOTOMETRIC_MONOCHROME = (0, 1)  # WhiteIsZero, BlackIsZero
TAG_CFA_REPEAT_PATTERN_DIM = 33421
TAG_CFA_PATTERN_EP = 33422
TAG_CFA_PLANE_COLOR = 50710
TAG_CFA_PATTERN_EXIF = 41730
TAG_DNG_VERSION = 50706
_MAX_IFDS = 256  # guards against absurd or looping IFD chains

# Make (upper-case prefix) -> format name of the TIFF-based RAW families LibRaw reads.
_TIFF_RAW_MAKES = {
    "NIKON": "NEF",
    "SONY": "ARW",
    "PENTAX": "PEF",
    "RICOH": "PEF",
    "SAMSUNG": "SRW",
    "CANON": "CR2",
    "KODAK": "DCR",
    "LEAF": "MOS",
    "MAMIYA": "MEF",
    "PHASE ONE": "IIQ",
    "HASSELBLAD": "3FR",
    "EPSON": "ERF",
    "MINOLTA": "MRW",
    "KONICA MINOLTA": "MRW",
}


# What Strata renders, named in every refusal of a sensor layout.
RENDERED = "Strata renders 2x2 RGB Bayer and 3-channel linear DNGs"
# TIFF/EP CFAPlaneColor codes.
_PLANE_COLOURS = {0: "red", 1: "green", 2: "blue", 3: "cyan", 4: "magenta", 5: "yellow", 6: "white"}
_BAYER = ("RGGB", "BGGR", "GRBG", "GBRG")
# Compression codes of integer DNG raw data left to LibRaw: none, lossless JPEG, lossy JPEG, JPEG XL. It read an
# integer deflate (8), LZW (5) or zstd (50000) raw IFD as corrupt or unsupported (measured), so those are refused.
DNG_COMPRESSIONS = (1, 7, 34892, 52546)
# LibRaw (the decoder) refuses raw images narrower or shorter than this ("Unsupported file format").
MIN_SIDE = 22


@dataclass
class RawProbe:
    """What the probe learnt about an upload; width/height are 0 when the format is not parsed.

    ``layout``: the raw image's layout where the probe could read it ("bayer": a 2x2 RGB CFA, "linear": a
    3-sample LinearRaw DNG), "" when it could not (non-TIFF formats, vendor TIFF-RAWs: LibRaw decides);
    ``cfa``: a Bayer DNG's pattern as its raw IFD states it (e.g. "RGGB"), "" otherwise.
    """

    make: str
    model: str
    width: int
    height: int
    format: str
    layout: str = ""
    cfa: str = ""


def probe_raw(source: Path | BinaryIO) -> RawProbe:
    """Recognise a RAW file by its signature and, for TIFF-based RAWs, check its structure.

    ``source``: a path, or a seekable binary reader (``Storage.open``: on object storage only the bytes of the
    TIFF structure are fetched, by ranged reads, never the whole upload).
    Raises ``BadRawFile`` ("not a RAW file: ..." or "truncated: ...") for bad input, and ``UnsupportedSensor``
    for a DNG whose sensor layout Strata does not render (X-Trans or other non-Bayer CFAs, monochrome, linear
    DNGs of other than 3 samples, floating point) or whose raw image is smaller than LibRaw reads (``MIN_SIDE``):
    the reason names the layout or the size. Nothing else.
    """
    if not isinstance(source, Path | str):
        return _probe_stream(source)
    try:
        with Path(source).open("rb") as f:
            return _probe_stream(f)
    except OSError as exc:
        raise BadRawFile(f"cannot read upload: {exc.strerror or exc}") from exc


def _probe_stream(f: BinaryIO) -> RawProbe:
    try:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        head = f.read(64)
    except OSError as exc:
        raise BadRawFile(f"cannot read upload: {exc.strerror or exc}") from exc
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        f.seek(0)
        try:
            return _probe_tiff(f, size, head)
        except BadRawFile:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ArithmeticError, struct.error) as exc:
            # a corrupt structure tifffile parses into nonsense (a tuple for a width, a zero-length tag ...)
            raise BadRawFile(f"not a RAW file: corrupt TIFF structure ({type(exc).__name__}: {exc})") from exc
    other = _probe_by_magic(head)
    if other is None:
        raise BadRawFile(f"not a RAW file: unrecognised signature {head[:8]!r}")
    return other


def _probe_by_magic(head: bytes) -> RawProbe | None:
    if head.startswith(b"FUJIFILMCCD-RAW"):
        model = head[28:60].split(b"\x00", 1)[0].decode("ascii", "replace").strip()
        return RawProbe(make="Fujifilm", model=model, width=0, height=0, format="RAF")
    if head[4:8] == b"ftyp" and head[8:12] == b"crx ":
        return RawProbe(make="Canon", model="", width=0, height=0, format="CR3")
    if head.startswith(b"IIU\x00"):
        return RawProbe(make="Panasonic", model="", width=0, height=0, format="RW2")
    if head[:4] in (b"IIRO", b"IIRS", b"MMOR"):
        return RawProbe(make="Olympus", model="", width=0, height=0, format="ORF")
    return None


def _walk(pages: tifffile.TiffPages, depth: int = 0) -> Iterator[tifffile.TiffPage]:
    """Every IFD of a chain and, depth-first, of its SubIFDs."""
    for page in pages:
        if not isinstance(page, tifffile.TiffPage):
            continue
        yield page
        sub = page.pages
        if sub is not None and depth < 4:
            yield from _walk(sub, depth + 1)


def _is_raw_ifd(page: tifffile.TiffPage) -> bool:
    tags = page.tags
    return (
        int(page.photometric) in (PHOTOMETRIC_CFA, PHOTOMETRIC_LINEAR_RAW)
        or TAG_CFA_PATTERN_EP in tags
        or TAG_CFA_PATTERN_EXIF in tags
    )


def _ascii_tag(page: tifffile.TiffPage, code: int) -> str:
    tag = page.tags.get(code)
    if tag is None or not isinstance(tag.value, str | bytes):
        return ""
    value = tag.value.decode("ascii", "replace") if isinstance(tag.value, bytes) else tag.value
    return value.strip("\x00 ").strip()


def _unsupported(what: str) -> UnsupportedSensor:
    return UnsupportedSensor(f"{what} is not supported; {RENDERED}")


def _bayer_pattern(page: tifffile.TiffPage) -> str:
    """A 2x2 RGB Bayer CFA IFD's pattern ("RGGB", ...; "" where CFAPattern is missing); :class:`UnsupportedSensor`
    naming any other CFA (X-Trans 6x6, other repeat sizes, CMYG or other plane colours, 2x2 patterns that are
    not Bayer)."""
    tags = page.tags
    dim = tuple(int(v) for v in (tags.valueof(TAG_CFA_REPEAT_PATTERN_DIM) or (2, 2)))
    if dim == (6, 6):
        raise _unsupported("X-Trans 6x6 CFA")
    if dim != (2, 2):
        raise _unsupported(f"a {'x'.join(str(v) for v in dim)} CFA (CFARepeatPatternDim)")
    planes = tuple(int(v) for v in (tags.valueof(TAG_CFA_PLANE_COLOR) or (0, 1, 2)))
    if sorted(planes) != [0, 1, 2]:
        names = "".join(_PLANE_COLOURS.get(c, "?")[0].upper() for c in planes)
        colours = ", ".join(_PLANE_COLOURS.get(c, f"colour {c}") for c in planes)
        raise _unsupported(f"a 2x2 {names} CFA ({colours})")
    pattern = tags.valueof(TAG_CFA_PATTERN_EP)
    if pattern is None:
        return ""
    if len(pattern) != 4 or any(int(v) >= len(planes) for v in pattern):
        raise _unsupported(f"a CFA pattern {list(pattern)} that does not fit its 2x2 repeat")
    name = "".join("RGB"[planes[int(v)]] for v in pattern)
    if name not in _BAYER:
        raise _unsupported(f"the 2x2 CFA pattern {name} (not a Bayer pattern)")
    return name


def _layout(page: tifffile.TiffPage) -> str:
    """The layout of a DNG's raw IFD ("bayer" or "linear"); :class:`UnsupportedSensor` for one Strata does not
    render (the reason names it)."""
    photometric, samples = int(page.photometric), int(page.samplesperpixel)
    if int(page.sampleformat) == 3:  # SampleFormat IEEE float (one value for every sample)
        raise _unsupported("a floating-point DNG")
    if int(page.bitspersample) > 16:
        raise _unsupported(f"a DNG of {int(page.bitspersample)}-bit samples (LibRaw reads up to 16 bits)")
    if int(page.compression) not in DNG_COMPRESSIONS:
        code = int(page.compression)
        name = page.compression.name.lower().replace("_", " ") if hasattr(page.compression, "name") else "?"
        raise UnsupportedSensor(f"DNG raw data compressed with {name} ({code}) is not supported: the decoder "
                                f"(LibRaw) does not read it; DNG converters write integer raw data uncompressed (1) "
                                f"or as lossless JPEG (7)")
    if photometric == PHOTOMETRIC_LINEAR_RAW:
        if samples == 3:
            return "linear"
        raise _unsupported("a monochrome linear DNG (1 sample per pixel)" if samples == 1
                           else f"a linear DNG with {samples} samples per pixel")
    if samples != 1:
        raise _unsupported(f"a CFA image with {samples} samples per pixel")
    if not _bayer_pattern(page):
        raise _unsupported("a CFA image without its CFAPattern tag (33422), which says the colour of each site,")
    return "bayer"


def _dng_layout(ifds: list[tifffile.TiffPage], raw_ifds: list[tifffile.TiffPage]) -> str:
    """The layout of a DNG: of its main raw IFD, or a refusal (monochrome: a full-size BlackIsZero raw IFD)."""
    if raw_ifds:
        return _layout(_main_ifd(raw_ifds))
    if any(int(p.photometric) in PHOTOMETRIC_MONOCHROME and int(p.subfiletype) == 0 for p in ifds):
        raise _unsupported("a monochrome DNG (no colour filter array)")
    raise BadRawFile("not a RAW file: a DNG without a CFA or linear-raw image")


def _check_dng_metadata(raw: tifffile.TiffPage, ifd0: tifffile.TiffPage) -> None:
    """:class:`BadRawFile` for a DNG whose levels or colour matrices no render can use (the decode refuses them
    too, after the upload was accepted): a BlackLevel not below the WhiteLevel, no ColorMatrix1 (the DNG
    specification requires it of colour images) or a colour matrix that is not 9 finite values of an invertible
    matrix. Other optional tags with unusable values are ignored by the decode (:func:`~services.raw.dng.usable`)."""
    pages = [raw, ifd0]
    try:
        blacks = tag_floats(find_tag(pages, TAG_BLACK_LEVEL)) or []
        whites = tag_floats(find_tag(pages, TAG_WHITE_LEVEL)) or []
        matrices = {code: tag_floats(find_tag(pages, code)) for code in (TAG_COLOR_MATRIX_1, TAG_COLOR_MATRIX_2)}
    except ValueError as exc:
        raise BadRawFile(f"implausible RAW metadata: {exc}") from exc
    if blacks and whites and max(blacks) >= min(whites):
        raise BadRawFile(f"implausible RAW metadata: BlackLevel {max(blacks):g} is not below WhiteLevel "
                         f"{min(whites):g}: no signal range is left")
    if matrices[TAG_COLOR_MATRIX_1] is None:
        raise BadRawFile("implausible RAW metadata: no ColorMatrix1 (50721): the DNG specification requires it of "
                         "colour images, and no colour can be computed without it")
    for code, values in matrices.items():
        name = "ColorMatrix1" if code == TAG_COLOR_MATRIX_1 else "ColorMatrix2"
        if values is None:
            continue
        if len(values) != 9:
            raise BadRawFile(f"implausible RAW metadata: {name} holds {len(values)} values; a 3-colour image "
                             f"needs 9")
        if not all(np.isfinite(values)):
            raise BadRawFile(f"implausible RAW metadata: {name} holds values that are not finite (a zero "
                             f"denominator?)")
        if np.linalg.matrix_rank(np.reshape(values, (3, 3))) < 3:
            raise BadRawFile(f"implausible RAW metadata: {name} {[round(v, 4) for v in values]} is singular: no "
                             f"colour can be computed from it")


def _active_size(raw: tifffile.TiffPage) -> tuple[int, int]:
    """(width, height) of the raw IFD's ActiveArea (the image the decoder renders), the whole image without one;
    :class:`BadRawFile` for an ActiveArea that does not lie inside the image."""
    width, height = int(raw.imagewidth), int(raw.imagelength)
    try:
        area = tag_floats(raw.tags.get(TAG_ACTIVE_AREA))
    except ValueError as exc:
        raise BadRawFile(f"implausible RAW metadata: {exc}") from exc
    if area is None:
        return width, height
    if len(area) != 4 or not all(np.isfinite(area)):
        raise BadRawFile(f"implausible RAW metadata: ActiveArea {area} is not 4 numbers (top, left, bottom, right)")
    top, left, bottom, right = (int(v) for v in area)
    if not (0 <= top < bottom <= height and 0 <= left < right <= width):
        raise BadRawFile(f"implausible RAW metadata: ActiveArea (top {top}, left {left}, bottom {bottom}, right "
                         f"{right}) does not lie inside the {width} x {height} raw image")
    return right - left, bottom - top


def _check_uncompressed_size(raw: tifffile.TiffPage) -> None:
    """``truncated`` for an uncompressed raw IFD whose strips or tiles hold fewer bytes than its stated size needs
    (LibRaw would read past them, or refuse the size as too big for memory, after the upload was accepted)."""
    if int(raw.compression) != 1:
        return
    bits = int(raw.bitspersample) * int(raw.samplesperpixel)
    need = int(raw.imagewidth) * int(raw.imagelength) * bits // 8
    held = sum(int(n) for n in raw.databytecounts)
    if held < need:
        raise BadRawFile(f"truncated: the {raw.imagewidth} x {raw.imagelength} raw image ({bits} bits a pixel, "
                         f"uncompressed) needs {need} bytes but its data holds {held}")


_JPEG_COMPRESSIONS = {7: "lossless JPEG", 34892: "lossy JPEG"}


def _check_jpeg_data(raw: tifffile.TiffPage, f: BinaryIO) -> None:
    """``corrupt`` for a raw IFD whose Compression says JPEG but whose first or last strip or tile does not start
    with a JPEG start-of-image marker (found from outside: plain data tagged lossless JPEG was accepted, then
    decoded to black or to noise and reported done). Two ranged reads of 2 bytes."""
    name = _JPEG_COMPRESSIONS.get(int(raw.compression))
    segments = [(int(o), int(n)) for o, n in zip(raw.dataoffsets, raw.databytecounts, strict=False) if n]
    if name is None or not segments:
        return
    for offset, _ in {segments[0], segments[-1]}:
        f.seek(offset)
        start = f.read(2)
        if start != b"\xff\xd8":
            raise BadRawFile(f"corrupt: the raw image is tagged {name} ({int(raw.compression)}) but its data at byte "
                             f"{offset} is not JPEG (starts with {start.hex() or 'nothing'}, not ffd8)")


def _check_jpeg_tiles(raw: tifffile.TiffPage) -> None:
    """Refuse lossless-JPEG raw data in tiles wider than the image (found here, session 49): LibRaw 0.22 wraps each
    JPEG row at the image's width, so the rest of a tile's row lands on the next image row, and the file decodes
    to misplaced samples and zeros without an error. Tiles no wider than the image decode exactly (tests)."""
    if int(raw.compression) == 7 and raw.is_tiled and int(raw.tilewidth) > int(raw.imagewidth):
        raise UnsupportedSensor(f"lossless JPEG raw data in tiles wider than the image ({int(raw.tilewidth)} > "
                                f"{int(raw.imagewidth)} px) is not supported: the decoder (LibRaw) misreads it; "
                                f"write it with tiles no wider than the image, in strips, or uncompressed")


def _main_ifd(raw_ifds: list[tifffile.TiffPage]) -> tifffile.TiffPage:
    """The raw IFD the decoder renders: the first full-resolution one (NewSubFileType 0) in file order, as LibRaw
    and :func:`~services.raw.dng.read_dng_tags` take it; the largest where none is marked so."""
    return next((p for p in raw_ifds if int(p.subfiletype) == 0),
                max(raw_ifds, key=lambda p: p.imagewidth * p.imagelength))


def _probe_tiff(f: BinaryIO, size: int, head: bytes) -> RawProbe:
    order: Literal["little", "big"] = "little" if head[:2] == b"II" else "big"
    first_ifd = int.from_bytes(head[4:8], order)
    if len(head) < 8 or first_ifd + 2 > size:
        raise BadRawFile(f"truncated: first IFD at byte {first_ifd} but the file has {size} bytes")
    try:
        with tifffile.TiffFile(f) as tif:
            ifds = []
            for page in _walk(tif.pages):
                ifds.append(page)
                if len(ifds) > _MAX_IFDS:
                    raise BadRawFile(f"not a RAW file: more than {_MAX_IFDS} IFDs")
            first = ifds[0] if ifds else None
            for page in ifds:
                for offset, count in zip(page.dataoffsets, page.databytecounts, strict=False):
                    if count and offset + count > size:
                        raise BadRawFile(
                            f"truncated: IFD at {page.offset} has data up to byte {offset + count} "
                            f"but the file has {size} bytes"
                        )
            make = _ascii_tag(first, 271) if first is not None else ""
            model = _ascii_tag(first, 272) if first is not None else ""
            is_dng = any(TAG_DNG_VERSION in page.tags for page in ifds)
            raw_ifds = [p for p in ifds if _is_raw_ifd(p)]
            layout = _dng_layout(ifds, raw_ifds) if is_dng else ""
    except (BadRawFile, UnsupportedSensor):
        raise
    except Exception as exc:  # tifffile raises many types on corrupt input
        raise BadRawFile(f"not a RAW file: unreadable TIFF structure ({type(exc).__name__}: {exc})") from exc

    is_cr2 = head[8:10] == b"CR"
    if not raw_ifds and not is_cr2:
        raise BadRawFile("not a RAW file: a TIFF without a CFA or linear-raw image")
    if is_dng:
        fmt = "DNG"
    elif is_cr2:
        fmt = "CR2"
    else:
        upper = make.upper()
        fmt = next((name for prefix, name in _TIFF_RAW_MAKES.items() if upper.startswith(prefix)), "TIFF-RAW")
    width = height = 0
    if raw_ifds:
        main = _main_ifd(raw_ifds)
        width, height = _active_size(main) if is_dng else (int(main.imagewidth), int(main.imagelength))
        if is_dng and min(width, height) < MIN_SIDE:
            raise _unsupported(f"a {width} x {height} pixel raw image (LibRaw reads at least {MIN_SIDE} x {MIN_SIDE})")
        if is_dng:
            _check_dng_metadata(main, ifds[0])
            _check_uncompressed_size(main)
            _check_jpeg_data(main, f)
            _check_jpeg_tiles(main)
    elif is_cr2 and len(ifds) > 3:
        width, height = int(ifds[3].imagewidth), int(ifds[3].imagelength)
    cfa = _bayer_pattern(_main_ifd(raw_ifds)) if layout == "bayer" else ""
    return RawProbe(make=make, model=model, width=width, height=height, format=fmt, layout=layout, cfa=cfa)
