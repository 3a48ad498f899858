"""What every output file says about itself: the capture's EXIF fields, resolution, software, the original name.

Carried over from the shot's :class:`~services.raw.meta.CaptureInfo` (read at decode): Make, Model, lens,
DateTimeOriginal, ExposureTime, FNumber, ISO, FocalLength and Orientation (written as read: pixels are not
rotated, viewers and DAMs turn them); plus XResolution/YResolution (the recipe's ppi, unit inch), Software
("Strata <version>") and the first frame's file name (DocumentName and ImageDescription).

TIFF: tifffile writes no EXIF sub-IFD, so the capture fields go into IFD0 as TIFF/EP tags (as a DNG has them;
exiftool reads them there), and again as an XMP packet (tag 700: the tiff/exif/exifEX/aux/xmp properties), which is
where Adobe's readers (Lightroom, Bridge) and DAMs that ignore TIFF/EP tags in IFD0 take them from. JPEG and PNG:
Pillow's :class:`PIL.Image.Exif`, with the capture fields in a proper EXIF IFD.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from importlib import metadata as importlib_metadata
from math import gcd
from xml.sax.saxutils import quoteattr

from PIL import Image, TiffImagePlugin, TiffTags

from services.raw.dng import (
    TAG_DATETIME_ORIGINAL,
    TAG_EXPOSURE_TIME,
    TAG_F_NUMBER,
    TAG_FOCAL_LENGTH,
    TAG_ISO,
    TAG_LENS_MODEL,
    TAG_MAKE,
    TAG_MODEL,
    TAG_ORIENTATION,
    TagTuple,
    ascii_text,
    capture_tags,
    exposure_rational,
)
from services.raw.meta import CaptureInfo

TAG_DOCUMENT_NAME = 269
TAG_IMAGE_DESCRIPTION = 270
TAG_X_RESOLUTION, TAG_Y_RESOLUTION, TAG_RESOLUTION_UNIT = 282, 283, 296
TAG_SOFTWARE = 305
TAG_XMP = 700
EXIF_IFD = 0x8769
RESOLUTION_INCH = 2


@lru_cache(maxsize=1)
def software_name() -> str:
    """``Strata <version>`` of the installed package."""
    try:
        return f"Strata {importlib_metadata.version('strata')}"
    except importlib_metadata.PackageNotFoundError:
        return "Strata"


@dataclass(frozen=True)
class OutputMetadata:
    """Everything an output file records about its shot (the same for every recipe but ``ppi``)."""

    capture: CaptureInfo
    original_name: str
    ppi: float = 300.0
    software: str = ""

    @property
    def software_text(self) -> str:
        return self.software or software_name()


def tiff_tags(meta: OutputMetadata) -> list[TagTuple]:
    """tifffile ``extratags`` of IFD0: Make, Model, DocumentName and the TIFF/EP capture tags. (Resolution,
    Software and ImageDescription go through tifffile's own arguments.)"""
    tags: list[TagTuple] = [(TAG_DOCUMENT_NAME, "s", 0, ascii_text(meta.original_name), True)]
    if meta.capture.make:
        tags.append((TAG_MAKE, "s", 0, ascii_text(meta.capture.make), True))
    if meta.capture.model:
        tags.append((TAG_MODEL, "s", 0, ascii_text(meta.capture.model), True))
    tags.append((TAG_XMP, "B", 0, xmp_packet(meta), True))
    return sorted(tags + capture_tags(meta.capture), key=lambda t: t[0])


_XMP_NAMESPACES = {"x": "adobe:ns:meta/", "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
                   "tiff": "http://ns.adobe.com/tiff/1.0/", "exif": "http://ns.adobe.com/exif/1.0/",
                   "exifEX": "http://cipa.jp/exif/1.0/", "aux": "http://ns.adobe.com/exif/1.0/aux/",
                   "xmp": "http://ns.adobe.com/xap/1.0/"}


def _xmp_ratio(value: float | None, encode: Callable[[float], tuple[int, int]]) -> str | None:
    try:
        if value is None:
            return None
        num, den = encode(value)
        return f"{num // gcd(num, den)}/{den // gcd(num, den)}" if num else "0/1"
    except (ValueError, OverflowError):  # not finite, negative, too large: left out, as in the TIFF/EP tags
        return None


def _xmp_date(exif_date: str | None) -> str | None:
    """EXIF's ``YYYY:MM:DD HH:MM:SS`` as XMP's ISO 8601 date; None where it is not such a date."""
    try:
        return datetime.strptime((exif_date or "").strip(), "%Y:%m:%d %H:%M:%S").isoformat()
    except ValueError:
        return None


def _xml_text(text: str) -> str:
    """``text`` without what XML 1.0 cannot hold (control characters, lone surrogates), trimmed."""
    return "".join(ch for ch in text if ch in "\t\n" or (ch >= " " and not "\ud800" <= ch <= "\udfff"
                                                          and ch not in "\ufffe\uffff")).strip()


def xmp_packet(meta: OutputMetadata) -> bytes:
    """An XMP packet of the capture fields (UTF-8: names beyond ASCII keep their letters here)."""
    c = meta.capture
    props = {"tiff:Make": c.make, "tiff:Model": c.model, "tiff:Orientation": str(int(c.orientation)),
             "exif:DateTimeOriginal": _xmp_date(c.datetime_original),
             "exif:ExposureTime": _xmp_ratio(c.exposure_time, exposure_rational),
             "exif:FNumber": _xmp_ratio(c.f_number, _decimal), "exif:FocalLength": _xmp_ratio(c.focal_length, _decimal),
             "exifEX:PhotographicSensitivity": str(min(int(c.iso), 65535)) if c.iso is not None and c.iso > 0 else None,
             "exifEX:LensModel": c.lens, "aux:Lens": c.lens, "xmp:CreatorTool": meta.software_text}
    attrs = "".join(f"\n   {k}={quoteattr(_xml_text(v))}" for k, v in props.items() if v and _xml_text(v))
    iso = props["exifEX:PhotographicSensitivity"]
    seq = f"\n   <exif:ISOSpeedRatings><rdf:Seq><rdf:li>{iso}</rdf:li></rdf:Seq></exif:ISOSpeedRatings>" if iso else ""
    names = " ".join(f'xmlns:{k}="{v}"' for k, v in _XMP_NAMESPACES.items() if k not in ("x", "rdf"))
    return (f'<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n<x:xmpmeta xmlns:x="{_XMP_NAMESPACES["x"]}">'
            f'<rdf:RDF xmlns:rdf="{_XMP_NAMESPACES["rdf"]}">\n  <rdf:Description rdf:about="" {names}{attrs}>'
            f'{seq}\n  </rdf:Description>\n</rdf:RDF></x:xmpmeta>\n<?xpacket end="w"?>').encode()


def _rational(value: float) -> TiffImagePlugin.IFDRational:
    return TiffImagePlugin.IFDRational(round(value * 10000), 10000)


def _decimal(value: float) -> tuple[int, int]:
    """``value`` in ten-thousandths, as an unsigned 32-bit RATIONAL holds it; ValueError where it cannot."""
    if not 0 <= value < 2**32 / 10000:
        raise ValueError(f"RATIONAL cannot hold {value}")
    return round(value * 10000), 10000


TAG_YCBCR_POSITIONING, TAG_EXIF_VERSION, TAG_COMPONENTS, TAG_FLASHPIX_VERSION = 0x0213, 0x9000, 0x9101, 0xA000
TAG_COLOR_SPACE, TAG_PIXEL_X, TAG_PIXEL_Y = 0xA001, 0xA002, 0xA003
COLOR_SPACE_SRGB, COLOR_SPACE_UNCALIBRATED = 1, 0xFFFF  # EXIF ColorSpace: other spaces are told by the ICC profile
# Pillow's tables lack ComponentsConfiguration's type (UNDEFINED, 4 bytes): unregistered, its bytes were written as
# BYTE, which exiftool -validate calls non-standard.
TiffTags.TAGS_V2_GROUPS.setdefault(EXIF_IFD, {}).setdefault(
    TAG_COMPONENTS, TiffTags.TagInfo(TAG_COMPONENTS, "ComponentsConfiguration", TiffTags.UNDEFINED, 4))


def pillow_exif(meta: OutputMetadata, colour_space: str = "srgb", jpeg_size: tuple[int, int] | None = None
                ) -> Image.Exif:
    """The EXIF block of a JPEG or PNG: IFD0 (make, model, orientation, resolution, software, names) and the
    EXIF IFD (ExifVersion 2.32, ColorSpace, capture date, exposure, aperture, ISO, focal length, lens); a JPEG
    (``jpeg_size``: its width and height) also the tags EXIF requires of one (YCbCrPositioning,
    ComponentsConfiguration, FlashpixVersion, its pixel size), so validators (exiftool -validate) miss none."""
    c = meta.capture
    exif = Image.Exif()
    if jpeg_size is not None:
        exif[TAG_YCBCR_POSITIONING] = 1  # centred
    for tag, text in ((TAG_MAKE, c.make), (TAG_MODEL, c.model), (TAG_DOCUMENT_NAME, meta.original_name),
                      (TAG_IMAGE_DESCRIPTION, meta.original_name), (TAG_SOFTWARE, meta.software_text)):
        if text:
            exif[tag] = ascii_text(text)
    exif[TAG_ORIENTATION] = int(c.orientation)
    exif[TAG_X_RESOLUTION] = exif[TAG_Y_RESOLUTION] = _rational(meta.ppi)
    exif[TAG_RESOLUTION_UNIT] = RESOLUTION_INCH
    ifd = exif.get_ifd(EXIF_IFD)
    ifd[TAG_EXIF_VERSION] = b"0232"
    ifd[TAG_COLOR_SPACE] = COLOR_SPACE_SRGB if colour_space == "srgb" else COLOR_SPACE_UNCALIBRATED
    if jpeg_size is not None:
        ifd[TAG_COMPONENTS], ifd[TAG_FLASHPIX_VERSION] = b"\x01\x02\x03\x00", b"0100"  # Y Cb Cr
        ifd[TAG_PIXEL_X], ifd[TAG_PIXEL_Y] = int(jpeg_size[0]), int(jpeg_size[1])
    if c.datetime_original:
        ifd[TAG_DATETIME_ORIGINAL] = ascii_text(c.datetime_original)
    for tag, value, encode in ((TAG_EXPOSURE_TIME, c.exposure_time, exposure_rational),
                               (TAG_F_NUMBER, c.f_number, _decimal), (TAG_FOCAL_LENGTH, c.focal_length, _decimal)):
        try:  # a value no RATIONAL holds (not finite, negative, too large) is left out, not the whole output
            if value is not None:
                ifd[tag] = TiffImagePlugin.IFDRational(*encode(value))
        except (ValueError, OverflowError):
            continue
    if c.iso is not None and c.iso > 0:
        ifd[TAG_ISO] = min(int(c.iso), 65535)
    if c.lens:
        ifd[TAG_LENS_MODEL] = ascii_text(c.lens)
    return exif
