"""Child process of :func:`services.raw.decode.decode_raw`: LibRaw runs here, so a crash spares the caller.

Usage: ``python -m services.raw.decode_child <raw> <out.npy> <out.json>``. On success writes the visible
Bayer image as a C-contiguous uint16 .npy and ``{"meta": RawMeta.to_dict()}``; on a handled failure writes
``{"error": kind, "message": text}`` (kind: "libraw", "memory", "unsupported", "error") and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from services.errors import UnsupportedSensor

EXIT_OK = 0
EXIT_HANDLED_ERROR = 1


def _write_atomic(path: Path, data: bytes) -> None:
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    os.replace(part, path)


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    part = path.with_name(path.name + ".part")
    with part.open("wb") as f:
        np.save(f, np.ascontiguousarray(array, dtype=np.uint16))
    os.replace(part, path)


def _black_levels_from_dng(
    values: list[float], repeat: tuple[int, int], top: int, left: int
) -> tuple[float, float, float, float] | None:
    """Per 2x2 site black levels of the visible image from DNG BlackLevel/BlackLevelRepeatDim."""
    rows, cols = repeat
    if rows not in (1, 2) or cols not in (1, 2) or len(values) != rows * cols:
        return None
    site = [values[((y + top) % rows) * cols + (x + left) % cols] for y in (0, 1) for x in (0, 1)]
    return (site[0], site[1], site[2], site[3])


def _linear_black_levels(values: list[float], repeat: tuple[int, int]) -> tuple[float, float, float, float] | None:
    """Per channel (R, G, B, G) black levels of a linear DNG from BlackLevel: one value for all samples or one
    per sample (BlackLevelRepeatDim 1x1); None for a repeating pattern (LibRaw's reading stays)."""
    if tuple(repeat) != (1, 1) or len(values) not in (1, 3):
        return None
    r, g, b = (values * 3)[:3] if len(values) == 1 else values
    return (r, g, b, g)


def _neutral_from_wb(wb: list[float]) -> tuple[float, float, float] | None:
    r, g, b = (float(v) for v in wb[:3])
    if min(r, g, b) <= 0:
        return None
    return (g / r, 1.0, g / b)  # neutral = 1 / wb normalised to green = 1


def _matrix_from_rgb_cam(rgb_cam: np.ndarray) -> list[list[float]]:
    """XYZ -> camera matrix (rows normalised to unit sRGB-white response) from LibRaw's camera -> sRGB; where
    LibRaw has none (a singular or non-finite one: a DNG whose colour tags it could not use, which the DNG's own
    ColorMatrix1 then replaces), the camera is taken to see sRGB."""
    from services.raw.colour import SRGB_TO_XYZ_D65

    matrix = np.asarray(rgb_cam, dtype=np.float64)[:, :3]
    if not np.all(np.isfinite(matrix)) or abs(np.linalg.det(matrix)) < 1e-12:
        matrix = np.eye(3)
    return (np.linalg.inv(matrix) @ np.linalg.inv(SRGB_TO_XYZ_D65)).tolist()


def _matrix9(values: list[float] | None) -> tuple[tuple[float, float, float], ...] | None:
    if values is None or len(values) != 9:
        return None
    return tuple((values[i], values[i + 1], values[i + 2]) for i in (0, 3, 6))


def _dng_profile_fields(tags: dict[str, Any]) -> dict[str, Any]:
    """CameraProfile keywords beyond ColorMatrix1 from :func:`read_dng_tags` (absent tags stay at their
    defaults)."""
    fields: dict[str, Any] = {
        name: _matrix9(tags[name])
        for name in ("color_matrix_2", "forward_matrix_1", "forward_matrix_2",
                     "camera_calibration_1", "camera_calibration_2")
    }
    balance = tags["analog_balance"]
    fields["analog_balance"] = tuple(balance[:3]) if balance is not None and len(balance) >= 3 else None
    fields["illuminant_1"], fields["illuminant_2"] = tags["calibration_illuminants"]
    return fields


def _linear_image(raw: Any) -> np.ndarray | None:
    """The (H, W, 3) visible image of a 3-colour linear DNG (LibRaw's Stack type), None for a Flat mosaic;
    UnsupportedSensor for other stacked layouts (4 colours, not RGB)."""
    import rawpy

    if raw.raw_type != rawpy.RawType.Stack:
        return None
    desc = raw.color_desc.decode("ascii", "replace")
    image = raw.raw_image_visible
    if raw.num_colors != 3 or desc[:3] != "RGB" or image.ndim != 3 or image.shape[2] < 3:
        raise UnsupportedSensor(f"a linear image of colours {desc!r} ({raw.num_colors}) is not supported; "
                                "Strata renders 2x2 RGB Bayer and 3-channel linear DNGs")
    return np.asarray(image[..., :3])


def _bayer_pattern(raw: Any) -> tuple[str, np.ndarray]:
    """The 2x2 CFA pattern name and LibRaw's colour index of the four sites; UnsupportedSensor otherwise."""
    import rawpy


    pattern = raw.raw_pattern
    desc = raw.color_desc.decode("ascii", "replace")
    if raw.raw_type != rawpy.RawType.Flat or pattern is None or pattern.shape != (2, 2):
        layout = "none" if pattern is None else f"{pattern.shape[0]}x{pattern.shape[1]}"
        raise UnsupportedSensor(f"unsupported sensor layout ({raw.raw_type.name}, CFA {layout}, {desc})")
    if raw.num_colors != 3 or desc[:3] != "RGB":
        raise UnsupportedSensor(f"unsupported sensor layout (colours {desc!r}); only RGB Bayer is supported")
    return _pattern_name(raw, raw.raw_colors_visible[:2, :2])  # colour index 3 is the second green


def _pattern_name(raw: Any, sites: np.ndarray) -> tuple[str, np.ndarray]:
    from services.raw.meta import CFA_PATTERNS

    desc = raw.color_desc.decode("ascii", "replace")
    cfa = "".join(desc[int(c)] for c in sites.ravel())
    if cfa not in CFA_PATTERNS:
        raise UnsupportedSensor(f"unsupported sensor layout (2x2 pattern {cfa})")
    return cfa, sites


def _odd_active_area(raw: Any, area: tuple[int, int, int, int] | None) -> tuple[int, int, int, int] | None:
    """A DNG's ActiveArea where its origin is odd (LibRaw rounds such margins up to even, losing the first row or
    column the file says is image: found from outside, a 600 x 400 area came out 599 x 399) and it lies inside
    the raw image; else None (LibRaw's visible area is the file's)."""
    if area is None or not (area[0] % 2 or area[1] % 2):
        return None
    top, left, bottom, right = area
    height, width = raw.raw_image.shape[:2]
    return area if 0 <= top < bottom <= height and 0 <= left < right <= width and min(bottom - top,
                                                                                      right - left) >= 2 else None


def _attr(obj: Any, *names: str) -> Any:
    """The first of ``names`` that ``obj`` has (rawpy renamed some fields between versions)."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def _libraw_capture(raw: Any) -> dict[str, Any]:
    """The capture fields LibRaw read (rawpy's ``other`` and ``lens``), as CaptureInfo keywords; zeros dropped."""
    import datetime as dt

    other, lens = getattr(raw, "other", None), getattr(raw, "lens", None)
    fields: dict[str, Any] = {}
    if other is not None:
        for key, names in (("exposure_time", ("shutter_speed", "shutter")), ("f_number", ("aperture",)),
                           ("focal_length", ("focal_length", "focal_len")), ("iso", ("iso_speed",))):
            value = float(_attr(other, *names) or 0)
            if value > 0:
                fields[key] = round(value) if key == "iso" else value
        stamp = _attr(other, "timestamp")
        if isinstance(stamp, (int, float)) and stamp > 0:
            stamp = dt.datetime.fromtimestamp(stamp)
        if isinstance(stamp, dt.datetime) and stamp.year > 1970:
            fields["datetime_original"] = stamp.strftime("%Y:%m:%d %H:%M:%S")
    name = _attr(lens, "model", "lens") if lens is not None else ""
    name = (name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name or "")).strip("\x00 ")
    if name:
        fields["lens"] = name
    return fields


def _libraw_fields(raw_path: Path, out_npy: Path, area: tuple[int, int, int, int] | None = None
                   ) -> tuple[dict[str, Any], tuple[int, int]]:
    """Decode with LibRaw and save the visible mosaic (``area``: a DNG's ActiveArea, used where LibRaw would round
    it); the RawMeta fields as LibRaw reports them (the colour matrix as ``color_matrix``) and the visible area's
    (top, left) margins."""
    import rawpy

    with rawpy.imread(str(raw_path)) as raw:
        linear = _linear_image(raw)
        per_channel = raw.black_level_per_channel  # LibRaw's black + cblack[c]
        margins = (raw.sizes.top_margin, raw.sizes.left_margin)
        if linear is None:
            cfa, sites = _bayer_pattern(raw)
            pixels = raw.raw_image_visible
            odd = _odd_active_area(raw, area)
            if odd is not None:
                top, left, bottom, right = odd
                cfa, sites = _pattern_name(raw, raw.raw_colors[top:top + 2, left:left + 2])
                pixels, margins = raw.raw_image[top:bottom, left:right], (top, left)
            blacks = tuple(float(per_channel[int(c)]) for c in sites.ravel())
        else:  # R, G, B and the second green, as LibRaw orders its channels
            cfa, pixels, blacks = "", linear, tuple(float(per_channel[c]) for c in (0, 1, 2, 1))
        height, width = pixels.shape[:2]
        _save_npy_atomic(out_npy, pixels)
        rgb_xyz = np.asarray(raw.rgb_xyz_matrix, dtype=np.float64)[:3]
        fields: dict[str, Any] = {
            "width": int(width),
            "height": int(height),
            "cfa": cfa,
            "layout": "bayer" if linear is None else "linear",
            "black_levels": blacks,
            "white_level": float(raw.white_level),
            "color_matrix": rgb_xyz.tolist() if np.any(rgb_xyz) else _matrix_from_rgb_cam(raw.color_matrix),
            "as_shot_neutral": _neutral_from_wb(list(raw.camera_whitebalance)),
            "capture": _libraw_capture(raw),
        }
        return fields, margins


def _apply_dng_tags(fields: dict[str, Any], tags: dict[str, Any], margins: tuple[int, int]) -> dict[str, Any]:
    """Let the DNG's own tags override LibRaw's view in ``fields`` (in place); returns the profile keywords."""
    from services.raw.meta import NoiseProfile

    fields["make"], fields["model"] = tags["make"], tags["model"]
    if tags["color_matrix"] is not None and len(tags["color_matrix"]) == 9:
        cm = tags["color_matrix"]
        fields["color_matrix"] = [cm[0:3], cm[3:6], cm[6:9]]
    if tags["as_shot_neutral"] is not None and len(tags["as_shot_neutral"]) >= 3:
        n = tags["as_shot_neutral"]
        fields["as_shot_neutral"] = (n[0], n[1], n[2])
    if tags["noise_profile"] is not None and len(tags["noise_profile"]) >= 2:
        fields["noise_profile"] = NoiseProfile(shot=tags["noise_profile"][0], read=tags["noise_profile"][1])
    (top, left), (area_top, area_left) = margins, tags["active_area_origin"]
    if fields["layout"] == "linear":
        fields["black_levels"] = _linear_black_levels(tags["black_level"], tags["black_level_repeat"]) or \
            fields["black_levels"]
    else:
        fields["black_levels"] = _black_levels_from_dng(tags["black_level"], tags["black_level_repeat"],
                                                        top - area_top, left - area_left) or fields["black_levels"]
    if tags["white_level"] is not None:
        fields["white_level"] = tags["white_level"]
    white_xy = tags["as_shot_white_xy"]
    fields["as_shot_white_xy"] = tuple(white_xy[:2]) if white_xy is not None and len(white_xy) >= 2 else None
    fields["baseline_exposure"] = float(tags["baseline_exposure"])
    if tags["as_shot_neutral"] is None and fields["as_shot_white_xy"] is not None:
        # The white is given as xy; LibRaw's derived camera WB would be a second opinion.
        fields["as_shot_neutral"] = None
    return _dng_profile_fields(tags)


def _capture(raw_path: Path, is_tiff: bool, libraw: dict[str, Any], make: str, model: str) -> Any:
    """CaptureInfo: the file's own TIFF/EXIF tags where it has them, LibRaw's reading for the rest."""
    from dataclasses import replace

    from services.raw.dng import read_capture_info
    from services.raw.meta import CaptureInfo

    info = (read_capture_info(raw_path) if is_tiff else None) or CaptureInfo()
    missing = {k: v for k, v in libraw.items() if not getattr(info, k)}
    return replace(info, **missing, make=info.make or make, model=info.model or model)


def _correct_mosaic(raw_path: Path, out_npy: Path, blacks: tuple[float, ...], margins: tuple[int, int]) -> None:
    """Apply the DNG's black level deltas and OpcodeList2 gain maps (:mod:`services.raw.corrections`) to the saved
    visible mosaic, where the file has them (rarely: the saved array is read back and saved again only then)."""
    import tifffile

    from services.raw.corrections import apply_corrections, read_corrections
    from services.raw.dng import TAG_ACTIVE_AREA, TAG_DNG_VERSION

    with tifffile.TiffFile(raw_path) as tif:
        ifd0 = tif.pages.first
        pages = [ifd0] + [p for p in (ifd0.pages or []) if isinstance(p, tifffile.TiffPage)]
        raw = next((p for p in pages if int(p.photometric) == 32803 and int(p.subfiletype) == 0), None)
        if raw is None or TAG_DNG_VERSION not in ifd0.tags:
            return
        corrections = read_corrections(raw)
        if not corrections.any:
            return
        h, w = raw.shape[:2]
        top, left, bottom, right = (int(v) for v in (raw.tags.valueof(TAG_ACTIVE_AREA) or (0, 0, h, w)))
    pixels = np.load(out_npy)
    site = np.asarray(blacks, np.float32).reshape(2, 2)
    black = np.tile(site, ((pixels.shape[0] + 1) // 2, (pixels.shape[1] + 1) // 2))[:pixels.shape[0], :pixels.shape[1]]
    corrected = apply_corrections(pixels, corrections, black, (margins[0] - top, margins[1] - left),
                                  (bottom - top, right - left))
    _save_npy_atomic(out_npy, corrected)


def extract(raw_path: Path, out_npy: Path) -> dict[str, Any]:
    """Decode ``raw_path`` with LibRaw, save its visible mosaic to ``out_npy``, return RawMeta as a dict."""
    from services.raw.colour import CameraProfile
    from services.raw.dng import read_dng_tags
    from services.raw.meta import RawMeta

    with raw_path.open("rb") as f:
        is_tiff = f.read(4) in (b"II*\x00", b"MM\x00*")
    tags = read_dng_tags(raw_path) if is_tiff else None
    fields, margins = _libraw_fields(raw_path, out_npy, None if tags is None else tags["active_area"])
    fields.update(make="", model="", noise_profile=None)
    profile_fields: dict[str, Any] = {}  # non-DNG: LibRaw's cam_xyz is a D65 matrix (the profile's default)
    if tags is not None:
        profile_fields = _apply_dng_tags(fields, tags, margins)
        if fields["layout"] == "bayer":
            _correct_mosaic(raw_path, out_npy, fields["black_levels"], margins)
    fields["capture"] = _capture(raw_path, is_tiff, fields.pop("capture"), fields["make"], fields["model"])
    c0, c1, c2 = fields.pop("color_matrix")
    profile = CameraProfile(color_matrix_1=(tuple(c0), tuple(c1), tuple(c2)), **profile_fields)
    return RawMeta(profile=profile, **fields).to_dict()


def _classify(exc: BaseException) -> str:
    import rawpy

    if isinstance(exc, MemoryError | rawpy.LibRawUnsufficientMemoryError | rawpy.LibRawTooBigError):
        return "memory"
    if isinstance(exc, UnsupportedSensor):
        return "unsupported"
    if isinstance(exc, rawpy.LibRawError):
        return "libraw"
    return "error"


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit code. ``-``: a spare started ahead of need, which imports the
    decoder, then reads the three paths from stdin, one per line (none: its parent is gone, exit quietly)."""
    if argv == ["-"]:
        import rawpy  # noqa: F401  (the import is what a spare does while it waits)

        import services.raw.dng  # noqa: F401

        argv = sys.stdin.read().splitlines()
        if not argv:
            return 0
    if len(argv) != 3:
        print("usage: python -m services.raw.decode_child <raw> <out.npy> <out.json> | -", file=sys.stderr)
        return 2
    raw_path, out_npy, out_json = (Path(a) for a in argv)
    try:
        result: dict[str, Any] = {"meta": extract(raw_path, out_npy)}
        code = EXIT_OK
    except Exception as exc:  # reported to the parent, which raises RawDecodeError
        detail = exc.args[0] if len(exc.args) == 1 else str(exc)
        if isinstance(detail, bytes):  # rawpy passes LibRaw's message as bytes
            detail = detail.decode("utf-8", "replace")
        result = {"error": _classify(exc), "message": f"{type(exc).__name__}: {detail}"}
        print(result["message"], file=sys.stderr)
        code = EXIT_HANDLED_ERROR
    _write_atomic(out_json, json.dumps(result).encode())
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
