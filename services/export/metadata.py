"""What every output file says about itself: the capture's EXIF fields, resolution, software, the original name.

Carried over from the shot's :class:`~services.raw.meta.CaptureInfo` (read at decode): Make, Model, lens,
DateTimeOriginal, ExposureTime, FNumber, ISO, FocalLength and Orientation (written as read: pixels are not
rotated, viewers and DAMs turn them); plus XResolution/YResolution (the recipe's ppi, unit inch), Software
("Strata <version>") and the first frame's file name (DocumentName and ImageDescription).

TIFF: tifffile writes no EXIF sub-IFD, so the capture fields go into IFD0 as TIFF/EP tags (as a DNG has them;
exiftool and DAMs read them there). JPEG and PNG: Pillow's :class:`PIL.Image.Exif`, with the capture fields in
a proper EXIF IFD.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata as importlib_metadata

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
    return tags + capture_tags(meta.capture)


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
