"""Minimal uncompressed DNG 1.4 writer for Bayer mosaics and linear (3-sample LinearRaw) images (tifffile),
readable by LibRaw/rawpy."""

from __future__ import annotations

import math
import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from services.raw.colour import CameraProfile, Matrix3
from services.raw.meta import CFA_PATTERNS, CaptureInfo, NoiseProfile

# TIFF/EP and DNG tag codes used here.
TAG_MAKE = 271
TAG_MODEL = 272
TAG_ORIENTATION = 274
# EXIF capture tags; TIFF/EP (and so DNG) allows them in IFD0, where write_dng puts them.
TAG_EXPOSURE_TIME = 33434
TAG_F_NUMBER = 33437
TAG_ISO = 34855
TAG_DATETIME_ORIGINAL = 36867
TAG_FOCAL_LENGTH = 37386
TAG_LENS_MODEL = 42036
TAG_CFA_REPEAT_PATTERN_DIM = 33421
TAG_CFA_PATTERN = 33422
TAG_DNG_VERSION = 50706
TAG_DNG_BACKWARD_VERSION = 50707
TAG_UNIQUE_CAMERA_MODEL = 50708
TAG_CFA_PLANE_COLOR = 50710
TAG_CFA_LAYOUT = 50711
TAG_BLACK_LEVEL_REPEAT_DIM = 50713
TAG_BLACK_LEVEL = 50714
TAG_WHITE_LEVEL = 50717
TAG_ACTIVE_AREA = 50829
TAG_COLOR_MATRIX_1 = 50721
TAG_COLOR_MATRIX_2 = 50722
TAG_CAMERA_CALIBRATION_1 = 50723
TAG_CAMERA_CALIBRATION_2 = 50724
TAG_ANALOG_BALANCE = 50727
TAG_AS_SHOT_NEUTRAL = 50728
TAG_AS_SHOT_WHITE_XY = 50729
TAG_BASELINE_EXPOSURE = 50730
TAG_CALIBRATION_ILLUMINANT_1 = 50778
TAG_CALIBRATION_ILLUMINANT_2 = 50779
TAG_FORWARD_MATRIX_1 = 50964
TAG_FORWARD_MATRIX_2 = 50965
TAG_NOISE_PROFILE = 51041

PHOTOMETRIC_CFA = 32803
PHOTOMETRIC_LINEAR_RAW = 34892
_CFA_COLOUR_CODE = {"R": 0, "G": 1, "B": 2}  # TIFF/EP CFAPattern colour codes

TagTuple = tuple[int, str, int, Any, bool]


def _matrix_tag(code: int, m: Matrix3 | np.ndarray | None) -> list[TagTuple]:
    if m is None:
        return []
    a = np.asarray(m, dtype=np.float64)
    if a.shape != (3, 3):
        raise ValueError(f"tag {code} needs a (3, 3) matrix, got {a.shape}")
    return [(code, "2i", 9, _rationals(a.ravel().tolist(), signed=True), True)]


def _profile_tags(p: CameraProfile) -> list[TagTuple]:
    """The profile's tags beyond ColorMatrix1: CalibrationIlluminant1 always, the rest where present
    (CalibrationIlluminant2 unless 0, "absent")."""
    tags: list[TagTuple] = [(TAG_CALIBRATION_ILLUMINANT_1, "H", 1, int(p.illuminant_1), True)]
    tags += _matrix_tag(TAG_COLOR_MATRIX_2, p.color_matrix_2)
    if p.illuminant_2:
        tags.append((TAG_CALIBRATION_ILLUMINANT_2, "H", 1, int(p.illuminant_2), True))
    tags += _matrix_tag(TAG_CAMERA_CALIBRATION_1, p.camera_calibration_1)
    tags += _matrix_tag(TAG_CAMERA_CALIBRATION_2, p.camera_calibration_2)
    tags += _matrix_tag(TAG_FORWARD_MATRIX_1, p.forward_matrix_1)
    tags += _matrix_tag(TAG_FORWARD_MATRIX_2, p.forward_matrix_2)
    if p.analog_balance is not None:
        tags.append((TAG_ANALOG_BALANCE, "2I", 3, _rationals(list(p.analog_balance), signed=False), True))
    return tags


def _neutral_tag(as_shot_neutral: Sequence[float], as_shot_white_xy: tuple[float, float] | None) -> list[TagTuple]:
    """AsShotNeutral; ``as_shot_neutral`` may be empty (no tag) when ``as_shot_white_xy`` is given instead."""
    neutral = [float(v) for v in as_shot_neutral]
    if not neutral and as_shot_white_xy is None:
        raise ValueError("need as_shot_neutral or as_shot_white_xy")
    if neutral and (len(neutral) != 3 or min(neutral) <= 0):
        raise ValueError(f"as_shot_neutral needs 3 positive values, got {neutral}")
    return [(TAG_AS_SHOT_NEUTRAL, "2I", 3, _rationals(neutral, signed=False), True)] if neutral else []


def _scene_tags(as_shot_white_xy: tuple[float, float] | None, baseline_exposure: float | None) -> list[TagTuple]:
    """AsShotWhiteXY and BaselineExposure where given (None: not written)."""
    tags: list[TagTuple] = []
    if as_shot_white_xy is not None:
        tags.append((TAG_AS_SHOT_WHITE_XY, "2I", 2, _rationals(list(as_shot_white_xy), signed=False), True))
    if baseline_exposure is not None:
        tags.append((TAG_BASELINE_EXPOSURE, "2i", 1, _rationals([baseline_exposure], signed=True), True))
    return tags


def exposure_rational(seconds: float) -> tuple[int, int]:
    """An exposure time as the usual 1/N rational when it is one (1/125 s -> (1, 125)), else decimal."""
    if 0 < seconds < 1 and abs(1 / seconds - round(1 / seconds)) < 1e-6 and round(1 / seconds) < 2**32:
        return 1, round(1 / seconds)
    return _rational(seconds, signed=False)


def capture_tags(capture: CaptureInfo | None) -> list[TagTuple]:
    """The EXIF capture tags (TIFF/EP form: in the image's IFD) of ``capture``, where it has them; Make and
    Model are written separately."""
    if capture is None:
        return []
    tags: list[TagTuple] = [(TAG_ORIENTATION, "H", 1, int(capture.orientation), True)]
    rationals = ((TAG_EXPOSURE_TIME, capture.exposure_time, exposure_rational),
                 (TAG_F_NUMBER, capture.f_number, _unsigned), (TAG_FOCAL_LENGTH, capture.focal_length, _unsigned))
    for code, value, encode in rationals:
        try:  # a value no RATIONAL holds (not finite, negative, too large) is left out, not the whole output
            if value is not None:
                tags.append((code, "2I", 1, encode(value), True))
        except (ValueError, OverflowError):
            continue
    if capture.iso is not None and capture.iso > 0:
        tags.append((TAG_ISO, "H", 1, min(int(capture.iso), 65535), True))
    if capture.datetime_original:
        tags.append(_ascii_tag(TAG_DATETIME_ORIGINAL, capture.datetime_original))
    if capture.lens:
        tags.append(_ascii_tag(TAG_LENS_MODEL, capture.lens))
    return sorted(tags, key=lambda t: t[0])


def _unsigned(value: float) -> tuple[int, int]:
    return _rational(value, signed=False)


def _rational(value: float, *, signed: bool) -> tuple[int, int]:
    """(numerator, denominator) with the largest power-of-ten denominator whose numerator fits 32 bits."""
    limit = 2**31 - 1 if signed else 2**32 - 1
    if not math.isfinite(value):
        raise ValueError(f"RATIONAL cannot hold {value}")
    if not signed and value < 0:
        raise ValueError(f"RATIONAL cannot hold a negative value: {value}")
    for exponent in range(9, -1, -1):
        den = 10**exponent
        num = round(value * den)
        if abs(num) <= limit:
            return num, den
    raise ValueError(f"value {value} does not fit a 32-bit rational")


def _rationals(values: Sequence[float], *, signed: bool) -> list[int]:
    flat: list[int] = []
    for v in values:
        flat.extend(_rational(float(v), signed=signed))
    return flat


# Letters NFKD does not take apart, as ASCII (a lens named "80mm ƒ/2.8" failed every TIFF output: TIFF ASCII is 7-bit).
_TRANSLITERATE = str.maketrans({"ƒ": "f", "ß": "ss", "æ": "ae", "Æ": "AE", "ø": "o", "Ø": "O", "œ": "oe", "Œ": "OE",
                                "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "þ": "th", "Þ": "Th", "μ": "u", "°": " deg",
                                "×": "x", "–": "-", "—": "-", "‘": "'", "’": "'", "“": '"', "”": '"', "…": "..."})


def ascii_text(text: str) -> str:
    """``text`` as 7-bit ASCII for a TIFF/EXIF ASCII field: accents dropped (``été`` -> ``ete``), a few letters
    spelled out (``ƒ`` -> ``f``), control characters as spaces, anything else ``?``."""
    text = unicodedata.normalize("NFKD", text.translate(_TRANSLITERATE)).translate(_TRANSLITERATE)
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text if not unicodedata.combining(c))
    return text.encode("ascii", "replace").decode("ascii")


def _ascii_tag(code: int, text: str) -> TagTuple:
    return (code, "s", 0, ascii_text(text), True)


def dng_tags(
    *,
    cfa: str,
    black_level: int,
    white_level: int,
    profile: CameraProfile,
    as_shot_neutral: Sequence[float],
    make: str,
    model: str,
    noise_profile: NoiseProfile | None,
    as_shot_white_xy: tuple[float, float] | None = None,
    baseline_exposure: float | None = None,
) -> list[TagTuple]:
    """The DNG tags of the raw IFD as tifffile ``extratags``; ``as_shot_neutral`` may be empty when
    ``as_shot_white_xy`` is given instead. ``cfa=""``: a linear (LinearRaw) image, no CFA tags."""
    if cfa and cfa not in CFA_PATTERNS:
        raise ValueError(f"cfa must be one of {CFA_PATTERNS} (or '' for a linear image), got {cfa!r}")
    neutral = _neutral_tag(as_shot_neutral, as_shot_white_xy)
    if not 0 <= black_level < white_level <= 65535:
        raise ValueError(f"need 0 <= black_level < white_level <= 65535, got {black_level}, {white_level}")
    cm = np.asarray(profile.color_matrix_1, dtype=np.float64)
    cfa_tags: list[TagTuple] = [
        (TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (2, 2), True),
        (TAG_CFA_PATTERN, "B", 4, tuple(_CFA_COLOUR_CODE[c] for c in cfa), True),
        (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True),
        (TAG_CFA_LAYOUT, "H", 1, 1, True),
    ] if cfa else []
    tags: list[TagTuple] = [
        _ascii_tag(TAG_MAKE, make),
        _ascii_tag(TAG_MODEL, model),
        *cfa_tags,
        (TAG_DNG_VERSION, "B", 4, (1, 4, 0, 0), True),
        (TAG_DNG_BACKWARD_VERSION, "B", 4, (1, 3, 0, 0), True),
        _ascii_tag(TAG_UNIQUE_CAMERA_MODEL, f"{make} {model}".strip()),
        (TAG_BLACK_LEVEL_REPEAT_DIM, "H", 2, (1, 1), True),
        (TAG_BLACK_LEVEL, "I", 1, int(black_level), True),
        (TAG_WHITE_LEVEL, "I", 1, int(white_level), True),
        (TAG_COLOR_MATRIX_1, "2i", 9, _rationals(cm.ravel().tolist(), signed=True), True),
    ]
    tags += neutral + _profile_tags(profile) + _scene_tags(as_shot_white_xy, baseline_exposure)
    if noise_profile is not None:
        tags.append((TAG_NOISE_PROFILE, "d", 2, (float(noise_profile.shot), float(noise_profile.read)), True))
    return tags


def write_dng(
    path: Path,
    mosaic: np.ndarray,
    *,
    cfa: str,
    black_level: int,
    white_level: int,
    profile: CameraProfile,
    as_shot_neutral: Sequence[float],
    make: str,
    model: str,
    noise_profile: NoiseProfile | None = None,
    as_shot_white_xy: tuple[float, float] | None = None,
    baseline_exposure: float | None = None,
    capture: CaptureInfo | None = None,
) -> None:
    """Write a (H, W) uint16 Bayer mosaic as an uncompressed DNG 1.4, atomically (temp file + rename).

    ``cfa`` is the 2x2 pattern read row-major from the top-left pixel; ``profile`` the camera profile
    (ColorMatrix1, XYZ -> camera, for ``profile.illuminant_1``, default D65, and the optional further tags:
    second illuminant, forward matrices, ...); ``as_shot_neutral`` the camera RGB of the scene white (or empty,
    with ``as_shot_white_xy``); ``baseline_exposure`` None is not written.
    """
    mosaic = np.asarray(mosaic)
    if mosaic.ndim != 2 or mosaic.dtype != np.uint16:
        raise ValueError(f"mosaic must be (H, W) uint16, got {mosaic.shape} {mosaic.dtype}")
    if mosaic.shape[0] < 2 or mosaic.shape[1] < 2:
        raise ValueError(f"mosaic must be at least 2x2, got {mosaic.shape}")
    tags = dng_tags(
        cfa=cfa,
        black_level=black_level,
        white_level=white_level,
        profile=profile,
        as_shot_neutral=as_shot_neutral,
        make=make,
        model=model,
        noise_profile=noise_profile,
        as_shot_white_xy=as_shot_white_xy,
        baseline_exposure=baseline_exposure,
    ) + capture_tags(capture)
    _write_raw_ifd(Path(path), mosaic, PHOTOMETRIC_CFA, tags)


def write_linear_dng(
    path: Path,
    image: np.ndarray,
    *,
    black_level: int,
    white_level: int,
    profile: CameraProfile,
    as_shot_neutral: Sequence[float],
    make: str,
    model: str,
    noise_profile: NoiseProfile | None = None,
    as_shot_white_xy: tuple[float, float] | None = None,
    baseline_exposure: float | None = None,
    capture: CaptureInfo | None = None,
) -> None:
    """Write a (H, W, 3) uint16 linear camera-RGB image (a DNG converter's "linear DNG": demosaiced, not
    white balanced, not colour converted) as an uncompressed DNG 1.4 with PhotometricInterpretation LinearRaw,
    atomically. The tags are :func:`write_dng`'s without the CFA ones; the black level is one for all channels.
    """
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint16:
        raise ValueError(f"image must be (H, W, 3) uint16, got {image.shape} {image.dtype}")
    tags = dng_tags(cfa="", black_level=black_level, white_level=white_level, profile=profile,
                    as_shot_neutral=as_shot_neutral, make=make, model=model, noise_profile=noise_profile,
                    as_shot_white_xy=as_shot_white_xy, baseline_exposure=baseline_exposure) + capture_tags(capture)
    _write_raw_ifd(Path(path), image, PHOTOMETRIC_LINEAR_RAW, tags)


def _write_raw_ifd(path: Path, data: np.ndarray, photometric: int, tags: list[TagTuple]) -> None:
    """One uncompressed raw IFD (IFD0) with ``tags``, written to a temp file and renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    row_bytes = data.shape[1] * data.itemsize * (data.shape[2] if data.ndim == 3 else 1)
    try:
        with tifffile.TiffWriter(tmp, bigtiff=False) as tif:
            tif.write(np.ascontiguousarray(data), photometric=photometric, planarconfig="contig", compression=None,
                      subfiletype=0, software=False, metadata=None, rowsperstrip=max(1, (1 << 20) // row_bytes),
                      extratags=tags)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def find_tag(pages: Sequence[tifffile.TiffPage], code: int) -> tifffile.TiffTag | None:
    """``code`` from the first page that has it (raw IFD first, then IFD0)."""
    for page in pages:
        tag = page.tags.get(code)
        if tag is not None:
            return tag
    return None


def tag_floats(tag: tifffile.TiffTag | None) -> list[float] | None:
    """Numeric tag values as floats; tifffile gives (S)RATIONALs as flat (num, den, ...) pairs."""
    if tag is None:
        return None
    try:
        values = np.atleast_1d(np.asarray(tag.value, dtype=np.float64)).ravel()
    except (ValueError, TypeError) as exc:  # a corrupt file: the reason names the tag
        raise ValueError(f"malformed DNG tag {tag.name} ({tag.code}): not numeric") from exc
    if int(tag.dtype) in (5, 10):  # RATIONAL, SRATIONAL; a zero denominator gives inf or NaN (callers check)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = values[0::2] / values[1::2]
    return values.tolist()


def _tag_text(tag: tifffile.TiffTag | None) -> str:
    if tag is None:
        return ""
    value = tag.value.decode("ascii", "replace") if isinstance(tag.value, bytes) else str(tag.value)
    return value.strip("\x00 ").strip()


# Optional DNG tags whose values no render can use are left out (their defaults apply: the as-shot white from the
# image, the noise estimated from it, no calibration), as Adobe's DNG SDK and LibRaw do: a zero denominator or a NaN
# in one of them once rendered a black TIFF and reported it done. BaselineExposure is a few stops at most in practice.
MAX_BASELINE_EXPOSURE = 10.0


def usable(values: list[float] | None, count: int, *, positive: bool = False, nonnegative: bool = False
           ) -> list[float] | None:
    """The first ``count`` of ``values`` when there are that many and all are finite (and > 0 with ``positive``,
    >= 0 with ``nonnegative``); None otherwise."""
    if values is None or len(values) < count:
        return None
    head = values[:count]
    if not all(np.isfinite(head)) or (positive and min(head) <= 0) or (nonnegative and min(head) < 0):
        return None
    return head


def _matrix_or_none(values: list[float] | None) -> list[float] | None:
    """A 3 x 3 matrix tag (9 values, row-major) that is finite and invertible; None otherwise."""
    m = usable(values, 9)
    return m if m is not None and abs(np.linalg.det(np.reshape(m, (3, 3)))) > 1e-12 else None


def _white_xy(values: list[float] | None) -> list[float] | None:
    xy = usable(values, 2, positive=True)
    return xy if xy is not None and xy[0] + xy[1] < 1 else None


def _baseline_exposure(values: list[float] | None) -> float:
    value = usable(values, 1)
    return value[0] if value is not None and abs(value[0]) <= MAX_BASELINE_EXPOSURE else 0.0


def read_dng_tags(path: Path) -> dict[str, Any] | None:
    """Exact DNG colour/level tags of the main raw IFD, or None if ``path`` is not a DNG.

    Keys: ``make``, ``model``, ``color_matrix`` (9 floats, row-major, or None), ``as_shot_neutral``,
    ``noise_profile`` (floats or None), the further colour tags ``color_matrix_2``, ``forward_matrix_1/2``,
    ``camera_calibration_1/2`` (9 floats or None), ``analog_balance``, ``as_shot_white_xy`` (floats or None),
    ``calibration_illuminants`` ((code1, code2), 0 where absent), ``baseline_exposure`` (float, 0 if absent),
    ``black_level`` (floats), ``black_level_repeat`` ((rows, cols)),
    ``white_level`` (float or None), ``active_area_origin`` ((top, left), the origin of the black pattern),
    ``active_area`` ((top, left, bottom, right) or None).
    Optional tags holding values no render can use (non-finite, a zero denominator, singular matrices, a white or
    balance of 0) read as absent (see :data:`MAX_BASELINE_EXPOSURE`); ColorMatrix1 is as stored (the upload's
    probe refuses a DNG without a usable one).
    """
    with tifffile.TiffFile(path) as tif:
        ifd0 = tif.pages.first
        if TAG_DNG_VERSION not in ifd0.tags:
            return None
        candidates = [ifd0]
        if ifd0.pages is not None:
            candidates += [p for p in ifd0.pages if isinstance(p, tifffile.TiffPage)]
        raw = next((p for p in candidates if int(p.photometric) in (PHOTOMETRIC_CFA, PHOTOMETRIC_LINEAR_RAW)
                    and int(p.subfiletype) == 0), ifd0)
        pages = [raw, ifd0]
        white = usable(tag_floats(find_tag([raw], TAG_WHITE_LEVEL)), 1, positive=True)
        repeat = tag_floats(find_tag([raw], TAG_BLACK_LEVEL_REPEAT_DIM)) or [1.0, 1.0]
        active = tag_floats(find_tag([raw], TAG_ACTIVE_AREA)) or [0.0, 0.0]
        black = tag_floats(find_tag([raw], TAG_BLACK_LEVEL)) or [0.0]
        noise = tag_floats(find_tag(pages, TAG_NOISE_PROFILE))
        return {
            "make": _tag_text(find_tag(pages, TAG_MAKE)),
            "model": _tag_text(find_tag(pages, TAG_MODEL)),
            "color_matrix": tag_floats(find_tag(pages, TAG_COLOR_MATRIX_1)),
            "as_shot_neutral": usable(tag_floats(find_tag(pages, TAG_AS_SHOT_NEUTRAL)), 3, positive=True),
            "noise_profile": noise if usable(noise, 2, nonnegative=True) is not None else None,
            "black_level": black if all(np.isfinite(black)) else [0.0],
            "black_level_repeat": (int(repeat[0]), int(repeat[-1])),
            "white_level": None if white is None else white[0],
            "active_area_origin": (int(active[0]), int(active[1])),
            "active_area": tuple(int(v) for v in active) if len(active) == 4 else None,
            "color_matrix_2": _matrix_or_none(tag_floats(find_tag(pages, TAG_COLOR_MATRIX_2))),
            "forward_matrix_1": _matrix_or_none(tag_floats(find_tag(pages, TAG_FORWARD_MATRIX_1))),
            "forward_matrix_2": _matrix_or_none(tag_floats(find_tag(pages, TAG_FORWARD_MATRIX_2))),
            "camera_calibration_1": _matrix_or_none(tag_floats(find_tag(pages, TAG_CAMERA_CALIBRATION_1))),
            "camera_calibration_2": _matrix_or_none(tag_floats(find_tag(pages, TAG_CAMERA_CALIBRATION_2))),
            "analog_balance": usable(tag_floats(find_tag(pages, TAG_ANALOG_BALANCE)), 3, positive=True),
            "as_shot_white_xy": _white_xy(tag_floats(find_tag(pages, TAG_AS_SHOT_WHITE_XY))),
            "calibration_illuminants": (
                int((tag_floats(find_tag(pages, TAG_CALIBRATION_ILLUMINANT_1)) or [0])[0]),
                int((tag_floats(find_tag(pages, TAG_CALIBRATION_ILLUMINANT_2)) or [0])[0]),
            ),
            "baseline_exposure": _baseline_exposure(tag_floats(find_tag(pages, TAG_BASELINE_EXPOSURE))),
        }


def _exif_value(pages: Sequence[tifffile.TiffPage], code: int, name: str) -> Any:
    """A capture tag's value from the pages' own tags (TIFF/EP) or their EXIF IFD (tifffile parses it into a
    dict keyed by tag name); None when absent. Rationals come back as floats."""
    tag = find_tag(pages, code)
    if tag is not None:
        if isinstance(tag.value, (str, bytes)):
            return _tag_text(tag)
        floats = tag_floats(tag)
        return floats[0] if floats else None
    for page in pages:
        exif = page.tags.get(34665)
        value = exif.value.get(name) if exif is not None and isinstance(exif.value, dict) else None
        if value is None:
            continue
        if isinstance(value, (str, bytes)):
            return (value.decode("ascii", "replace") if isinstance(value, bytes) else value).strip("\x00 ").strip()
        flat = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
        if flat.size == 2 and code in (TAG_EXPOSURE_TIME, TAG_F_NUMBER, TAG_FOCAL_LENGTH):
            return float(flat[0] / flat[1]) if flat[1] else None
        return float(flat[0]) if flat.size else None
    return None


MAX_CAPTURE_TEXT = 255  # characters kept of a capture tag's text (Make, Model, LensModel, DateTimeOriginal)


def read_capture_info(path: Path) -> CaptureInfo | None:
    """The capture tags of a TIFF-structured RAW (DNG, and TIFF-based vendor formats): IFD0 and the raw IFD
    first, then the EXIF IFD; None when ``path`` is no TIFF or cannot be parsed."""
    try:
        with tifffile.TiffFile(path) as tif:
            ifd0 = tif.pages.first
            pages = [ifd0]
            if ifd0.pages is not None:
                pages += [p for p in ifd0.pages if isinstance(p, tifffile.TiffPage)]

            def get(code: int, name: str) -> Any:
                return _exif_value(pages, code, name)

            def num(code: int, name: str) -> float | None:  # a zero denominator (inf) or NaN reads as absent
                value = get(code, name)
                return float(value) if isinstance(value, (int, float)) and 0 < value < 1e9 else None

            def text(code: int, name: str) -> str:  # what an output's EXIF can carry (a JPEG's EXIF is <= 64 KB)
                return str(get(code, name) or "")[:MAX_CAPTURE_TEXT]

            iso, orientation = num(TAG_ISO, "ISOSpeedRatings"), num(TAG_ORIENTATION, "Orientation")
            return CaptureInfo(
                make=text(TAG_MAKE, "Make"), model=text(TAG_MODEL, "Model"), lens=text(TAG_LENS_MODEL, "LensModel"),
                datetime_original=text(TAG_DATETIME_ORIGINAL, "DateTimeOriginal"),
                exposure_time=num(TAG_EXPOSURE_TIME, "ExposureTime"), f_number=num(TAG_F_NUMBER, "FNumber"),
                iso=None if iso is None else int(iso), focal_length=num(TAG_FOCAL_LENGTH, "FocalLength"),
                orientation=int(orientation) if orientation and 1 <= orientation <= 8 else 1,
            )
    except (tifffile.TiffFileError, OSError, ValueError, KeyError, TypeError, IndexError):
        return None
