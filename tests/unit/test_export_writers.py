"""Output writers: TIFF 16/8 (deflate + predictor), JPEG, PNG 16, read back with tifffile, Pillow and exiftool
(an independent reader); resizing in linear light; byte-identical files (ICC included) across processes."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

from lab.synth.synth import synthetic_capture
from services.export.derive import fit_long_edge, resize_linear, to_8bit
from services.export.icc import icc_profile
from services.export.metadata import OutputMetadata
from services.export.naming import NameTokens
from services.export.output import write_outputs
from services.export.recipes import get_recipe, resolve_recipes
from services.pipeline.ops.colour import decode_transfer
from services.storage.local import LocalStorage

TOKENS = NameTokens("st", "IQ3_S", "2026-11-30", "frame_00", 1, "job1")
META = OutputMetadata(synthetic_capture("IQ3_S"), "frame_00.dng")
RECIPES = ["tiff16", "tiff8", "jpeg-proof", "png16", "tiff16-adobergb"]


def _image(h: int = 300, w: int = 440) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 65535, (h, w, 3)).astype(np.uint16)


def _write(root: Path, rgb: np.ndarray, names: list[str] = RECIPES) -> dict[str, Path]:
    storage = LocalStorage(root)
    bands = [(0, rgb[:128]), (128, rgb[128:])]
    outs = write_outputs(storage, "job1", {"srgb": bands, "adobergb": bands}, resolve_recipes(names), TOKENS, META,
                         threads=2)
    return {o.recipe: storage.local_path(o.storage_key) for o in outs}


def test_tiffs_are_deflate_with_predictor_in_16_and_8_bits(tmp_path: Path) -> None:
    rgb = _image()
    files = _write(tmp_path, rgb)
    for recipe, dtype, expected in (("tiff16", np.uint16, rgb), ("tiff8", np.uint8, to_8bit(rgb))):
        with tifffile.TiffFile(files[recipe]) as tif:
            page = tif.pages[0]
            assert page.compression == 8 and page.predictor == 2 and page.is_tiled  # Adobe deflate, horizontal
            assert page.dtype == dtype and bytes(page.tags[34675].value) == icc_profile("srgb")
            assert page.tags["XResolution"].value == (300, 1) and page.tags["ResolutionUnit"].value == 2
            np.testing.assert_array_equal(page.asarray(), expected)
    with Image.open(files["tiff8"]) as im:  # a reader without zstd (Pillow's libtiff) opens the deflate TIFF
        np.testing.assert_array_equal(np.asarray(im), to_8bit(rgb))
    with tifffile.TiffFile(files["tiff16-adobergb"]) as tif:
        assert bytes(tif.pages[0].tags[34675].value) == icc_profile("adobergb")


def test_jpeg_proof_and_png16(tmp_path: Path) -> None:
    rgb = _image(900, 2000)
    files = _write(tmp_path, rgb)
    with Image.open(files["jpeg-proof"]) as im:
        assert im.format == "JPEG" and im.size == (1600, 720)  # long edge 1600, aspect kept
        assert im.info["icc_profile"] == icc_profile("srgb") and im.info["dpi"] == (300, 300)
        exif = im.getexif()
        assert exif[271] == "Phase One" and exif[272] == "IQ3_S"
        assert exif.get_ifd(0x8769)[36867] == "2026:11:30 14:05:09"
    with Image.open(files["png16"]) as im:
        assert im.format == "PNG" and im.info["icc_profile"] == icc_profile("srgb")
        assert im.getexif()[271] == "Phase One"
    import png

    width, height, rows, info = png.Reader(filename=str(files["png16"])).read()
    assert (width, height, info["bitdepth"], info["planes"]) == (2000, 900, 16, 3)
    np.testing.assert_array_equal(np.vstack(list(rows)).reshape(900, 2000, 3), rgb)


def _exif_ifd_types(app1: bytes) -> dict[int, int]:
    """Tag -> TIFF type of the EXIF IFD in a JPEG's APP1 payload ("Exif\\0\\0" + a TIFF header and IFDs)."""
    import struct

    tiff = app1[6:]
    end = ">" if tiff[:2] == b"MM" else "<"

    def entries(offset: int) -> list[tuple[int, int, int]]:
        (n,) = struct.unpack(end + "H", tiff[offset:offset + 2])
        return [struct.unpack(end + "HHII", tiff[offset + 2 + 12 * i:offset + 14 + 12 * i])[:2]
                + struct.unpack(end + "I", tiff[offset + 10 + 12 * i:offset + 14 + 12 * i]) for i in range(n)]

    (ifd0,) = struct.unpack(end + "I", tiff[4:8])
    exif_ifd = next(value for tag, _, value in entries(ifd0) if tag == 0x8769)
    return {tag: type_ for tag, type_, _ in entries(exif_ifd)}


def test_jpeg_exif_version_tags_are_undefined_bytes(tmp_path: Path) -> None:
    """ExifVersion, ComponentsConfiguration and FlashpixVersion are UNDEFINED (7) as EXIF defines them: Pillow
    wrote ComponentsConfiguration as BYTE (1), which exiftool -validate calls non-standard."""
    files = _write(tmp_path, _image(300, 400))
    with Image.open(files["jpeg-proof"]) as im:
        types = _exif_ifd_types(im.info["exif"])
    assert {tag: types[tag] for tag in (0x9000, 0x9101, 0xA000)} == {0x9000: 7, 0x9101: 7, 0xA000: 7}


def test_resize_fits_the_long_edge_in_linear_light() -> None:
    assert fit_long_edge(900, 1200, 600) == (450, 600) and fit_long_edge(100, 50, 600) == (100, 50)
    # Alternating black and white columns: the linear-light mean is 0.5, which sRGB encodes as ~0.735; a
    # gamma-space average would give 0.5 (much too dark).
    rgb = np.zeros((64, 256, 3), np.uint16)
    rgb[:, ::2] = 65535
    out = resize_linear(rgb, 64, "srgb")
    assert tuple(out.shape) == (1, 3, 16, 64)
    centre = out[..., 4:-4, 4:-4]
    linear = decode_transfer(centre, "srgb")
    assert torch.allclose(linear, torch.full_like(linear, 0.5), atol=0.01)
    sharp = resize_linear(rgb, 64, "srgb", sharpen_amount=1.0)
    assert sharp.shape == out.shape and float(sharp.min()) >= 0.0 and float(sharp.max()) <= 1.0


def test_names_beyond_ascii_are_written_as_ascii(tmp_path: Path) -> None:
    """Found from outside: a lens named "… 80mm ƒ/2.8" failed every TIFF output ("TIFF strings must be 7-bit
    ASCII") and came out "?/2.8" in JPEGs; accents and such letters are spelled in ASCII now."""
    from dataclasses import replace

    storage = LocalStorage(tmp_path)
    meta = OutputMetadata(replace(synthetic_capture("IQ3_S"), lens="Schneider Kreuznach LS 80mm ƒ/2.8",
                                  model="IQ3\u00a0S"), "写真 été.dng")
    rgb = _image()
    outs = write_outputs(storage, "job1", {"srgb": [(0, rgb)]}, resolve_recipes(["tiff16", "jpeg-proof"]), TOKENS,
                         meta, threads=2)
    with tifffile.TiffFile(storage.local_path(outs[0].storage_key)) as tif:
        tags = tif.pages[0].tags
        assert tags[42036].value == "Schneider Kreuznach LS 80mm f/2.8"  # LensModel
        assert tags["DocumentName"].value == "?? ete.dng" and tags["Model"].value == "IQ3 S"
    with Image.open(storage.local_path(outs[1].storage_key)) as im:
        assert im.getexif().get_ifd(0x8769)[42036] == "Schneider Kreuznach LS 80mm f/2.8"


@pytest.mark.skipif(shutil.which("exiftool") is None, reason="exiftool (libimage-exiftool-perl) not installed")
def test_metadata_reads_back_in_exiftool(tmp_path: Path) -> None:
    files = _write(tmp_path, _image(400, 300))
    report = json.loads(subprocess.run(["exiftool", "-j", "-n", *map(str, files.values())], capture_output=True,
                                       text=True, check=True).stdout)
    assert len(report) == len(RECIPES)
    for tags in report:
        assert tags["Make"] == "Phase One" and tags["Model"] == "IQ3_S", tags["SourceFile"]
        assert tags["DateTimeOriginal"] == "2026:11:30 14:05:09"
        assert tags["ExposureTime"] == pytest.approx(1 / 125) and tags["FNumber"] == 8 and tags["ISO"] == 100
        assert tags["FocalLength"] == 80 and tags["LensModel"].startswith("Schneider")
        assert tags["Orientation"] == 1 and tags["XResolution"] == 300 and tags["ResolutionUnit"] == 2
        assert tags["Software"].startswith("Strata") and tags["DocumentName"] == "frame_00.dng"


_CHILD = """
import hashlib, sys
from pathlib import Path
from tests.unit.test_export_writers import _image, _write
for recipe, path in sorted(_write(Path(sys.argv[1]), _image(200, 260)).items()):
    print(recipe, hashlib.sha256(path.read_bytes()).hexdigest())
"""


def test_two_processes_write_the_same_bytes(tmp_path: Path) -> None:
    """Every file, ICC profile and tags included, is byte-identical from one process to the next."""
    runs = [subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / f"run{i}")], capture_output=True,
                           text=True, check=True, cwd=Path(__file__).resolve().parents[2]).stdout for i in range(2)]
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == len(RECIPES)


def test_recipe_ppi_is_written(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    recipe = get_recipe("tiff8").model_copy(update={"ppi": 360.0, "naming": "{stem}_{seq}"})
    rgb = _image(64, 64)
    (out,) = write_outputs(storage, "j", {"srgb": [(0, rgb)]}, [recipe], TOKENS, META)
    assert out.name == "frame_00_0001.tif" and out.media_type == "image/tiff" and out.recipe == "tiff8"
    with tifffile.TiffFile(io.BytesIO(storage.local_path(out.storage_key).read_bytes())) as tif:
        assert tif.pages[0].tags["XResolution"].value == (360, 1)


def test_resize_bins_by_an_integer_factor_before_the_filter_and_reads_bands() -> None:
    from services.export.derive import box_factor

    assert box_factor(10304, 7728, 1600, 1200) == 3 and box_factor(100, 100, 80, 80) == 1
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 65535, (120, 90, 3), dtype=np.uint16)
    whole = resize_linear(rgb, 20, "srgb")
    banded = resize_linear([(0, rgb[:50]), (50, rgb[50:])], 20, "srgb")  # strips straddle the binning chunks
    assert torch.equal(whole, banded) and tuple(whole.shape) == (1, 3, 20, 15)
    # A flat grey stays the same grey through the lookup, the binning and the filter.
    flat = np.full((300, 200, 3), 30000, np.uint16)
    out = resize_linear(flat, 50, "srgb")
    assert torch.allclose(out, torch.full_like(out, 30000 / 65535), atol=2e-5)


def test_tiffs_carry_the_capture_fields_as_xmp_too(tmp_path: Path) -> None:
    """A TIFF's capture fields sit in IFD0 (TIFF/EP: tifffile writes no EXIF IFD), which Adobe's readers skip, so
    they are also in an XMP packet (tag 700), parsed here as XML and, where installed, by exiftool's XMP reader."""
    import xml.etree.ElementTree as ET

    files = _write(tmp_path, _image(200, 260), ["tiff16"])
    with tifffile.TiffFile(files["tiff16"]) as tif:
        packet = bytes(tif.pages[0].tags[700].value)
    rdf = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}"
    desc = ET.fromstring(packet.split(b"?>", 1)[1].rsplit(b"<?xpacket", 1)[0]).find(f"{rdf}RDF/{rdf}Description")
    assert desc is not None
    exif = "{http://ns.adobe.com/exif/1.0/}"
    assert desc.get(f"{exif}ExposureTime") == "1/125" and desc.get(f"{exif}FNumber") == "8/1"
    assert desc.get(f"{exif}DateTimeOriginal") == "2026-11-30T14:05:09"
    assert desc.get("{http://ns.adobe.com/tiff/1.0/}Model") == "IQ3_S"
    if shutil.which("exiftool") is None:
        return
    tags = json.loads(subprocess.run(["exiftool", "-j", "-n", "-XMP:all", str(files["tiff16"])], capture_output=True,
                                     text=True, check=True).stdout)[0]
    assert tags["Make"] == "Phase One" and tags["ExposureTime"] == pytest.approx(1 / 125) and tags["FNumber"] == 8
    assert tags["ISO"] == 100 and tags["FocalLength"] == 80 and tags["LensModel"].startswith("Schneider")
    assert tags["CreatorTool"].startswith("Strata") and tags["DateTimeOriginal"] == "2026:11:30 14:05:09"
