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
from tests.raw_layouts import REFUSED, bayer_dng, linear_dng, lossless_jpeg_dng, lossless_jpeg_linear_dng


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


def test_refuses_data_tagged_jpeg_that_is_not_jpeg(tmp_path: Path) -> None:
    """Found from outside: plain raw data whose Compression tag was changed to lossless JPEG (7) was accepted,
    then decoded to black (or noise) and reported done."""
    path = tmp_path / "badcomp.dng"
    path.write_bytes(bayer_dng())
    with tifffile.TiffFile(path, mode="r+b") as tif:
        tif.pages.first.tags["Compression"].overwrite(7)
    with pytest.raises(BadRawFile, match=r"corrupt: the raw image is tagged lossless JPEG \(7\) but its data at "
                                         r"byte \d+ is not JPEG"):
        probe_raw(path)


@pytest.mark.parametrize(("compression", "says"), [("zlib", "adobe deflate (8)"), ("lzw", "lzw (5)"),
                                                   ("zstd", "zstd (50000)")])
def test_refuses_raw_data_compressed_as_libraw_does_not_read(compression: str, says: str) -> None:
    """LibRaw reads such a file as corrupt or unsupported (measured: deflate "Corrupted data", LZW and zstd
    "Unsupported file format"), so the upload is refused, naming the compression and the ones that are allowed."""
    with pytest.raises(UnsupportedSensor) as info:
        probe_raw(io.BytesIO(bayer_dng(compression=compression)))
    assert f"DNG raw data compressed with {says} is not supported" in info.value.reason
    assert "the decoder (LibRaw) does not read it" in info.value.reason and info.value.status_code == 422


def test_refuses_lossless_jpeg_tiles_wider_than_the_image() -> None:
    """Found in session 49: LibRaw wraps such a tile's JPEG rows at the image's width and decodes misplaced samples
    and zeros without an error (tiles no wider than the image decode exactly: test_raw_decode.py)."""
    with pytest.raises(UnsupportedSensor) as info:
        probe_raw(io.BytesIO(lossless_jpeg_dng(48, 72, 256)))
    assert info.value.reason.startswith("lossless JPEG raw data in tiles wider than the image (256 > 72 px) is not "
                                        "supported") and info.value.status_code == 422
    assert probe_raw(io.BytesIO(lossless_jpeg_dng(48, 72, 64))).layout == "bayer"
    with pytest.raises(UnsupportedSensor, match="tiles wider than the image"):
        probe_raw(io.BytesIO(lossless_jpeg_linear_dng(48, 72, 256)))  # LibRaw misreads linear ones alike
    assert probe_raw(io.BytesIO(lossless_jpeg_linear_dng(48, 72, 32))).layout == "linear"


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


def _dng_with(tmp_path: Path, new: list[tuple] = (), drop: tuple[int, ...] = (), dtype: type = np.uint16,
              extra: tuple[tuple, ...] = ()) -> Path:
    """A 200 x 300 Bayer DNG (tests.raw_layouts' tags) with tags replaced (``new``), removed (``drop``) or added."""
    from services.raw.dng import dng_tags
    from tests.raw_layouts import PROFILE

    tags = dng_tags(cfa="RGGB", black_level=256, white_level=16383, profile=PROFILE, as_shot_neutral=(0.5, 1, 0.7),
                    make="Acme", model="Probe", noise_profile=None)
    codes = {t[0] for t in new} | set(drop)
    tags = [t for t in tags if t[0] not in codes] + list(new) + list(extra)
    mosaic = np.random.default_rng(1).integers(300, 16000, (200, 300)).astype(dtype)
    path = tmp_path / "edited.dng"
    tifffile.imwrite(path, mosaic, photometric=PHOTOMETRIC_CFA, subfiletype=0, software=False, metadata=None,
                     extratags=tags)
    return path


@pytest.mark.parametrize(("new", "drop", "dtype", "says"), [
    ((), (33422,), np.uint16, "without its CFAPattern tag"),
    ((), (33421, 33422, 50710), np.uint16, "without its CFAPattern tag"),
    ((), (50721,), np.uint16, "no ColorMatrix1"),
    (((50721, "2i", 6, (9, 10, -3, 10, -1, 10, -4, 10, 13, 10, 1, 10), True),), (), np.uint16, "holds 6 values"),
    (((50721, "2i", 9, (9, 0) + (1, 10) * 8, True),), (), np.uint16, "not finite"),
    (((50829, "I", 4, (0, 0, 5000, 5000), True),), (), np.uint16, "ActiveArea .* does not lie inside"),
    (((50829, "I", 4, (100, 100, 10, 10), True),), (), np.uint16, "ActiveArea .* does not lie inside"),
    (((50829, "I", 4, (0, 0, 10, 10), True),), (), np.uint16, "a 10 x 10 pixel raw image"),
    ((), (), np.uint32, "32-bit samples"),
])
def test_refuses_dngs_the_decode_would_fail_on(tmp_path: Path, new: tuple, drop: tuple, dtype: type,
                                               says: str) -> None:
    """Found from outside: each of these was accepted with 202 and its job then failed at decode with LibRaw's or
    numpy's words (``Singular matrix``, ``unsupported sensor layout``, ``Unsupported file format``)."""
    with pytest.raises((BadRawFile, UnsupportedSensor), match=says):
        probe_raw(_dng_with(tmp_path, list(new), drop, dtype))


def test_the_probe_reports_the_size_the_decoder_renders(tmp_path: Path) -> None:
    """The ActiveArea's size (the stack check compared whole raw images: frames that differ only there were
    accepted, then failed as mismatched)."""
    probe = probe_raw(_dng_with(tmp_path, [(50829, "I", 4, (2, 4, 198, 296), True)]))
    assert (probe.width, probe.height) == (292, 196)


@pytest.mark.parametrize(("code", "kind", "count", "value", "key", "absent"), [
    (51041, "d", 2, (float("nan"), float("nan")), "noise_profile", None),
    (51041, "d", 2, (-1.0, -1.0), "noise_profile", None),
    (50728, "2I", 3, (1, 2, 1, 0, 7, 10), "as_shot_neutral", None),
    (50717, "2I", 1, (16383, 0), "white_level", None),
    (50730, "2i", 1, (1, 0), "baseline_exposure", 0.0),
    (50730, "2i", 1, (2**31 - 1, 1), "baseline_exposure", 0.0),
    (50964, "2i", 9, (0, 1) * 9, "forward_matrix_1", None),
    (50727, "2I", 3, (0, 1) * 3, "analog_balance", None),
    (50729, "2I", 2, (0, 1, 0, 1), "as_shot_white_xy", None),
])
def test_optional_tags_no_render_can_use_read_as_absent(tmp_path: Path, code: int, kind: str, count: int,
                                                        value: tuple, key: str, absent: object) -> None:
    """A NaN, a zero denominator, a white of 0, a singular forward matrix: the defaults apply, as in the DNG SDK
    (these rendered all-black TIFFs reported done, or failed the job with ``math domain error``)."""
    from services.raw.decode_child import extract
    from services.raw.dng import read_dng_tags

    path = _dng_with(tmp_path, [(code, kind, count, value, True)])
    probe_raw(path)  # accepted
    assert read_dng_tags(path)[key] == absent  # type: ignore[index]
    meta = extract(path, tmp_path / "m.npy")
    pixels = np.load(tmp_path / "m.npy")
    assert pixels.shape == (200, 300) and meta["white_level"] > max(meta["black_levels"])


def test_capture_tags_no_output_can_hold_are_left_out(tmp_path: Path) -> None:
    """An FNumber of 1/0 failed the job after its render ("cannot convert float infinity to integer"), a 70 000
    character LensModel its JPEG proof ("EXIF data is too long")."""
    from services.export.metadata import OutputMetadata, pillow_exif
    from services.raw.dng import capture_tags, read_capture_info
    from services.raw.meta import CaptureInfo

    path = _dng_with(tmp_path, extra=((33437, "2I", 1, (28, 0), True), (42036, "s", 0, "L" * 70000, True)))
    info = read_capture_info(path)
    assert info is not None and info.f_number is None and len(info.lens) == 255
    odd = CaptureInfo(make="A", model="B", exposure_time=float("inf"), f_number=-2.0, focal_length=1e12, iso=0)
    assert {t[0] for t in capture_tags(odd)} == {274}  # orientation only
    pillow_exif(OutputMetadata(odd, "a.dng")).tobytes()


@pytest.mark.parametrize(("original", "date"), [
    ("2026:11:30 10:00:00", "2026-11-30"), ("2024:02:29 23:59:59", "2024-02-29"),
    ("2026:13:45 10:00:00", None), ("2026:02:29 10:00:00", None), ("0000:00:00 00:00:00", None), ("", None),
    ("2026:1:5", None), ("    :  :     ", None),
])
def test_capture_dates_are_calendar_dates(original: str, date: str | None) -> None:
    """Found from outside: ``{capture_date}`` in an output's name could read 2026-13-45; a date that is not one
    falls back to the upload date (services/jobs/finalize.py)."""
    from services.raw.meta import CaptureInfo

    assert CaptureInfo(datetime_original=original).capture_date == date
