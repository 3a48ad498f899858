"""probe_raw: accepts RAW signatures and sound TIFF RAWs, rejects everything else with BadRawFile."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from lab.synth.synth import COLOR_MATRIX
from services.errors import BadRawFile, UnsupportedSensor
from services.raw.colour import CameraProfile
from services.raw.dng import PHOTOMETRIC_CFA, write_dng
from services.raw.probe import RENDERED, probe_raw
from tests.raw_layouts import REFUSED, bayer_dng, linear_dng


@pytest.fixture
def dng(tmp_path: Path) -> Path:
    path = tmp_path / "frame.dng"
    mosaic = np.random.default_rng(0).integers(0, 65535, (40, 60)).astype(np.uint16)
    write_dng(
        path,
        mosaic,
        cfa="RGGB",
        black_level=1024,
        white_level=65535,
        profile=CameraProfile(COLOR_MATRIX),
        as_shot_neutral=(0.6, 1.0, 0.7),
        make="Phase One",
        model="IQ2_XS",
    )
    return path


def test_accepts_dng(dng: Path) -> None:
    probe = probe_raw(dng)
    assert (probe.format, probe.make, probe.model, probe.width, probe.height) == (
        "DNG",
        "Phase One",
        "IQ2_XS",
        60,
        40,
    )


def test_rejects_truncated_dng(dng: Path, tmp_path: Path) -> None:
    data = dng.read_bytes()
    cut = tmp_path / "cut.dng"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadRawFile, match="^truncated"):
        probe_raw(cut)


def test_rejects_tiff_header_only(tmp_path: Path) -> None:
    path = tmp_path / "header.dng"
    path.write_bytes(b"II*\x00\x00\x10\x00\x00")
    with pytest.raises(BadRawFile, match="^truncated"):
        probe_raw(path)


def test_rejects_corrupt_ifd(tmp_path: Path) -> None:
    path = tmp_path / "junk.dng"
    path.write_bytes(b"II*\x00\x08\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(BadRawFile):
        probe_raw(path)


def test_rejects_rgb_tiff(tmp_path: Path) -> None:
    path = tmp_path / "photo.tif"
    tifffile.imwrite(path, np.zeros((16, 16, 3), np.uint16), photometric="rgb")
    with pytest.raises(BadRawFile, match="^not a RAW file"):
        probe_raw(path)


@pytest.mark.parametrize("suffix", ["png", "jpeg"])
def test_rejects_ordinary_images(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"photo.{suffix}"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(path)
    with pytest.raises(BadRawFile, match="^not a RAW file"):
        probe_raw(path)


@pytest.mark.parametrize("content", [b"", b"hello, this is not a raw file\n"])
def test_rejects_text_and_empty_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(BadRawFile, match="^not a RAW file"):
        probe_raw(path)


def test_missing_file_is_bad_raw(tmp_path: Path) -> None:
    with pytest.raises(BadRawFile):
        probe_raw(tmp_path / "nope.dng")


def test_tiff_based_vendor_raw(tmp_path: Path) -> None:
    path = tmp_path / "shot.nef"
    tifffile.imwrite(
        path,
        np.zeros((24, 32), np.uint16),
        photometric=PHOTOMETRIC_CFA,
        extratags=[(271, "s", 0, "NIKON CORPORATION", True), (272, "s", 0, "NIKON D850", True)],
    )
    probe = probe_raw(path)
    assert (probe.format, probe.make, probe.model, probe.width, probe.height) == (
        "NEF",
        "NIKON CORPORATION",
        "NIKON D850",
        32,
        24,
    )


@pytest.mark.parametrize(
    ("head", "fmt", "make"),
    [
        (b"FUJIFILMCCD-RAW 0201FF383501" + b"X-T5".ljust(32, b"\x00"), "RAF", "Fujifilm"),
        (b"\x00\x00\x00\x18ftypcrx \x00\x00\x00\x01", "CR3", "Canon"),
        (b"IIU\x00\x08\x00\x00\x00", "RW2", "Panasonic"),
        (b"IIRO\x08\x00\x00\x00", "ORF", "Olympus"),
        (b"MMOR\x00\x00\x00\x08", "ORF", "Olympus"),
    ],
)
def test_recognises_other_raw_signatures(tmp_path: Path, head: bytes, fmt: str, make: str) -> None:
    path = tmp_path / "shot.raw"
    path.write_bytes(head + bytes(256))
    probe = probe_raw(path)
    assert (probe.format, probe.make, probe.width, probe.height) == (fmt, make, 0, 0)
    if fmt == "RAF":
        assert probe.model == "X-T5"


@pytest.mark.parametrize("case", list(REFUSED))
def test_refuses_layouts_strata_does_not_render(case: str) -> None:
    write, phrase = REFUSED[case]
    with pytest.raises(UnsupportedSensor) as info:
        probe_raw(io.BytesIO(write()))
    assert phrase in info.value.reason and RENDERED in info.value.reason
    assert info.value.status_code == 422 and info.value.type == "unsupported_sensor"


@pytest.mark.parametrize(("compression", "says"), [("zlib", "adobe deflate (8)"), ("lzw", "lzw (5)"),
                                                   ("zstd", "zstd (50000)")])
def test_refuses_raw_data_compressed_as_libraw_does_not_read(compression: str, says: str) -> None:
    """LibRaw reads such a file as corrupt or unsupported (measured: deflate "Corrupted data", LZW and zstd
    "Unsupported file format"), so the upload is refused, naming the compression and the ones that are allowed."""
    with pytest.raises(UnsupportedSensor) as info:
        probe_raw(io.BytesIO(bayer_dng(compression=compression)))
    assert f"DNG raw data compressed with {says} is not supported" in info.value.reason
    assert "the decoder (LibRaw) does not read it" in info.value.reason and info.value.status_code == 422


def test_linear_and_bayer_dngs_say_their_layout(dng: Path) -> None:
    assert (probe_raw(io.BytesIO(linear_dng())).layout, probe_raw(io.BytesIO(linear_dng())).cfa) == ("linear", "")
    assert (probe_raw(dng).layout, probe_raw(dng).cfa) == ("bayer", "RGGB")
    assert probe_raw(io.BytesIO(bayer_dng(pattern="GBRG"))).cfa == "GBRG"



@pytest.mark.parametrize(("tag", "value", "says"), [
    (50717, 1024, "BlackLevel 1024 is not below WhiteLevel 1024"),
    (50717, 1000, "BlackLevel 1024 is not below WhiteLevel 1000"),
    (50714, 65535, "BlackLevel 65535 is not below WhiteLevel 65535"),
    (50721, (0, 1) * 9, "ColorMatrix1 .* is singular"),
    (50721, (1, 1, 2, 1, 3, 1) * 3, "ColorMatrix1 .* is singular"),  # three equal rows
])
def test_refuses_levels_and_matrices_no_render_can_use(dng: Path, tag: int, value: object, says: str) -> None:
    """A DNG whose BlackLevel is not below its WhiteLevel, or whose ColorMatrix is singular, is refused at upload
    (the decode failed on it after a 202); the reason names the tags."""
    with tifffile.TiffFile(dng, mode="r+b") as tif:
        page = next(p for p in tif.pages if tag in p.tags)
        page.tags[tag].overwrite(value)
    with pytest.raises(BadRawFile, match=f"implausible RAW metadata: {says}"):
        probe_raw(dng)


@pytest.mark.parametrize(("width", "height"), [(60000, 60000), (100000, 40), (60, 41)])
def test_refuses_uncompressed_raw_data_shorter_than_its_stated_size(dng: Path, width: int, height: int) -> None:
    """An uncompressed raw IFD whose stated size needs more bytes than its strips hold is truncated (LibRaw refused
    60000 x 60000 as too big for memory, or read past the data, after a 202)."""
    with tifffile.TiffFile(dng, mode="r+b") as tif:
        page = next(p for p in tif.pages if int(p.photometric) == PHOTOMETRIC_CFA)
        page.tags[256].overwrite(width)
        page.tags[257].overwrite(height)
        if 278 in page.tags:
            page.tags[278].overwrite(height)
    with pytest.raises(BadRawFile, match=rf"truncated: the {width} x {height} raw image \(16 bits a pixel, "
                                         rf"uncompressed\) needs {width * height * 2} bytes but its data holds 4800"):
        probe_raw(dng)
