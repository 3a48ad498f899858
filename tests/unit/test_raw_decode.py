"""decode_raw: LibRaw in a child process; failures, crashes and hangs become RawDecodeError."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tifffile

from lab.synth.synth import COLOR_MATRIX, synthesize_shot
from lab.synth.unprocess import COLOR_MATRIX_STD_A, read_from_shot, synthetic_profile
from lab.synth.unprocess import FORWARD_MATRIX_D65 as FM_D65
from services.errors import RawDecodeError
from services.raw import decode
from services.raw.colour import WHITE_D65, CameraProfile, as_shot_neutral
from services.raw.decode import decode_raw as _decode_raw
from services.raw.dng import (
    PHOTOMETRIC_CFA,
    TAG_BLACK_LEVEL,
    TAG_BLACK_LEVEL_REPEAT_DIM,
    dng_tags,
    write_dng,
)
from services.raw.meta import NoiseProfile, RawMeta
from tests.raw_layouts import bayer_dng, linear_dng, lossless_jpeg_dng, lossless_jpeg_linear_dng


def decode_raw(path: Path, out: Path, **kwargs: object) -> RawMeta:
    """The LibRaw child (these tests are about it): the fast DNG path off (tests/unit/test_raw_fast_dng.py)."""
    return _decode_raw(path, out, fast_dng=False, **kwargs)  # type: ignore[arg-type]


def test_decodes_synthetic_frame(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ2_XS", tmp_path / "shot", scale=0.02, frames=2, cfa="GRBG")
    out = tmp_path / "frame.npy"
    meta = decode_raw(shot.files[1], out)
    pixels = np.load(out)
    assert pixels.dtype == np.uint16 and pixels.flags.c_contiguous
    assert pixels.shape == (meta.height, meta.width) == (146, 138)
    assert meta.cfa == "GRBG"
    assert meta.black_levels == (1024.0,) * 4 and meta.white_level == 65535.0
    assert meta.profile.color_matrix_1 == tuple(tuple(row) for row in COLOR_MATRIX.tolist())
    neutral = synthetic_profile().xy_to_neutral(WHITE_D65)  # the DNG model's D65 neutral
    assert meta.as_shot_neutral == pytest.approx(tuple(neutral), rel=1e-8)
    assert meta.as_shot_neutral == pytest.approx(tuple(as_shot_neutral(COLOR_MATRIX)), rel=2e-4)  # dcraw-style
    assert (meta.profile.illuminant_1, meta.profile.illuminant_2) == (21, 17)
    assert np.allclose(meta.profile.color_matrix_2, COLOR_MATRIX_STD_A)
    assert np.allclose(meta.profile.forward_matrix_1, FM_D65)
    assert meta.baseline_exposure == 0.0 and meta.profile.analog_balance is None
    assert RawMeta.from_dict(meta.to_dict()) == meta
    assert (meta.make, meta.model) == ("Phase One", "IQ2_XS")
    assert meta.noise_profile == NoiseProfile(shot=0.002, read=read_from_shot(0.002))
    assert RawMeta.from_dict(meta.to_dict()) == meta
    assert not (tmp_path / "frame.npy.part").exists()


def test_decodes_through_spare_children(tmp_path: Path) -> None:
    """Decodes after the first run in children started ahead of need; each child decodes one file and exits."""
    shot = synthesize_shot("IQ2_XS", tmp_path / "shot", scale=0.02, frames=2)
    first = decode_raw(shot.files[0], tmp_path / "a.npy")
    deadline = time.monotonic() + 30
    while not decode._spares._idle and time.monotonic() < deadline:  # the refill thread starts one
        time.sleep(0.05)
    _, spare = decode._spares._idle[-1]
    second = decode_raw(shot.files[1], tmp_path / "b.npy")
    assert spare.returncode == 0  # this spare did the decode and exited
    assert first.cfa == second.cfa and np.load(tmp_path / "b.npy").shape == (second.height, second.width)


def test_prestarted_spares_and_a_fork_does_not_take_its_parents() -> None:
    decode.prestart(2)
    deadline = time.monotonic() + 30
    while len(decode._spares._idle) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    inherited = list(decode._spares._idle)
    assert len(inherited) >= 2
    decode._spares._pid = -1  # as seen from a forked process: the spares are another process's children
    try:
        assert decode._spares.take(8192) is None and decode._spares._idle == []
    finally:
        decode._spares.done()
        for _, child in inherited:
            decode._discard(child)


def test_spares_refill_after_decodes_to_as_many_as_ran_at_once(tmp_path: Path) -> None:
    """A shot's decodes run in spares; one thread refills after them, to the count that ran at once, not more
    (racing refill threads started while decodes ran overshot, and competed with the decodes for CPU)."""
    shot = synthesize_shot("IQ2_XS", tmp_path / "shot", scale=0.02, frames=4)
    decode.prestart(4)
    want = decode._spares._want

    def settle() -> None:
        deadline = time.monotonic() + 30
        while (len(decode._spares._idle) < want or decode._spares._refilling) and time.monotonic() < deadline:
            time.sleep(0.05)

    settle()
    with ThreadPoolExecutor(4) as pool:
        metas = list(pool.map(lambda i: decode_raw(shot.files[i], tmp_path / f"{i}.npy"), range(4)))
    assert all(m.cfa == metas[0].cfa for m in metas)
    settle()
    assert len(decode._spares._idle) == want


def test_a_path_with_a_line_break_decodes_in_a_fresh_child(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ2_XS", tmp_path / "shot", scale=0.02, frames=2)
    odd = tmp_path / "line\nbreak.dng"
    odd.write_bytes(shot.files[0].read_bytes())
    meta = decode_raw(odd, tmp_path / "out\n.npy")
    assert np.load(tmp_path / "out\n.npy").shape == (meta.height, meta.width)


def test_spare_child_exits_quietly_when_its_parent_goes() -> None:
    child = decode._spawn([*decode._DEFAULT_COMMAND, "-"], 8192)
    _, err = child.communicate(b"", timeout=60)  # stdin closed with no paths, as when the parent exits
    assert child.returncode == 0 and err == b""


def test_exact_pixels_and_per_site_black_levels(tmp_path: Path) -> None:
    """A 2x2 BlackLevel pattern maps to sites; pixels come back bit-exact."""
    mosaic = np.random.default_rng(2).integers(0, 65535, (30, 42)).astype(np.uint16)
    path, out = tmp_path / "x.dng", tmp_path / "x.npy"
    write_dng(
        path,
        mosaic,
        cfa="BGGR",
        black_level=0,
        white_level=65535,
        profile=CameraProfile(COLOR_MATRIX),
        as_shot_neutral=(0.5, 1.0, 0.8),
        make="Test",
        model="Pattern",
    )
    tags = [t for t in dng_tags(
        cfa="BGGR", black_level=0, white_level=65535, profile=CameraProfile(COLOR_MATRIX),
        as_shot_neutral=(0.5, 1.0, 0.8), make="Test", model="Pattern", noise_profile=None,
    ) if t[0] not in (TAG_BLACK_LEVEL, TAG_BLACK_LEVEL_REPEAT_DIM)]  # fmt: skip
    tags += [(TAG_BLACK_LEVEL_REPEAT_DIM, "H", 2, (2, 2), True), (TAG_BLACK_LEVEL, "I", 4, (510, 520, 530, 540), True)]
    tifffile.imwrite(path, mosaic, photometric=PHOTOMETRIC_CFA, extratags=tags, metadata=None)
    meta = decode_raw(path, out)
    np.testing.assert_array_equal(np.load(out), mosaic)
    assert meta.cfa == "BGGR"
    assert meta.black_levels == (510.0, 520.0, 530.0, 540.0)
    assert meta.as_shot_neutral == (0.5, 1.0, 0.8)
    assert meta.noise_profile is None


def test_truncated_dng_is_decode_error(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ3_S", tmp_path / "shot", scale=0.02)
    data = shot.files[0].read_bytes()
    cut = tmp_path / "cut.dng"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(RawDecodeError, match="^LibRaw: "):
        decode_raw(cut, tmp_path / "cut.npy", timeout_s=60)
    assert not (tmp_path / "cut.npy").exists()


def test_text_file_is_decode_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a raw file\n" * 100)
    with pytest.raises(RawDecodeError, match="^LibRaw: "):
        decode_raw(path, tmp_path / "notes.npy", timeout_s=60)


def test_crashing_child_becomes_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "CHILD_COMMAND", [sys.executable, "-c", "import os; os.abort()"])
    with pytest.raises(RawDecodeError, match=r"LibRaw crashed \(signal SIGABRT\)"):
        decode_raw(tmp_path / "x.dng", tmp_path / "x.npy")


def test_hanging_child_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "CHILD_COMMAND", [sys.executable, "-c", "import time; time.sleep(60)"])
    start = time.monotonic()
    with pytest.raises(RawDecodeError, match="decode timed out after 1s"):
        decode_raw(tmp_path / "x.dng", tmp_path / "x.npy", timeout_s=1.0)
    assert time.monotonic() - start < 10


def test_memory_limit_becomes_error(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ3_S", tmp_path / "shot", scale=0.02)
    with pytest.raises(RawDecodeError, match=r"out of memory \(limit 64 MiB\)"):
        decode_raw(shot.files[0], tmp_path / "x.npy", memory_mb=64)


def test_capture_info_is_read_at_decode_and_survives_old_rows(tmp_path: Path) -> None:
    """The synthetic DNG's capture tags come back from the decoder child (its own TIFF/EXIF tags, checked against
    exiftool's reading where installed); a stored RawMeta without them still loads."""
    import json
    import shutil
    import subprocess

    from lab.synth.synth import synthetic_capture
    from services.raw.decode_child import _libraw_capture

    shot = synthesize_shot("IQ3_S", tmp_path / "s", scale=0.03, seed=3)
    meta = decode_raw(shot.files[0], tmp_path / "raw.npy")
    expected = synthetic_capture("IQ3_S")
    assert meta.capture is not None and meta.capture == expected and meta.capture.capture_date == "2026-11-30"
    assert RawMeta.from_dict(meta.to_dict()) == meta
    old = {k: v for k, v in meta.to_dict().items() if k != "capture"}
    assert RawMeta.from_dict(old).capture is None
    if shutil.which("exiftool"):
        tags = json.loads(subprocess.run(["exiftool", "-j", "-n", str(shot.files[0])], capture_output=True,
                                         text=True, check=True).stdout)[0]
        assert (tags["DateTimeOriginal"], tags["ISO"], tags["FNumber"], tags["FocalLength"]) == (
            expected.datetime_original, expected.iso, expected.f_number, expected.focal_length)

    class Other:  # rawpy's view, for files without TIFF tags
        aperture, focal_length, iso_speed, shutter_speed = 5.6, 120.0, 200.0, 0.004
        timestamp = __import__("datetime").datetime(2026, 3, 4, 5, 6, 7)

    class Lens:
        model = "LS 120mm"

    class Raw:
        other, lens = Other(), Lens()

    assert _libraw_capture(Raw()) == {"exposure_time": 0.004, "f_number": 5.6, "focal_length": 120.0, "iso": 200,
                                      "datetime_original": "2026:03:04 05:06:07", "lens": "LS 120mm"}


@pytest.mark.parametrize(("layout", "tile"), [("bayer", 32), ("bayer", 64), ("linear", 32), ("linear", 64)])
def test_lossless_jpeg_tiles_decode_to_the_uncompressed_samples(tmp_path: Path, layout: str, tile: int) -> None:
    # DNG converters write raw data as lossless JPEG tiles (a linear DNG's with three interleaved components); edge
    # tiles are padded. (Tiles wider than the image are misread by LibRaw and refused at upload:
    # test_raw_probe.py.)
    plain, packed = tmp_path / "plain.dng", tmp_path / "ljpeg.dng"
    plain.write_bytes(bayer_dng(48, 72) if layout == "bayer" else linear_dng(48, 72))
    packed.write_bytes(lossless_jpeg_dng(48, 72, tile) if layout == "bayer" else lossless_jpeg_linear_dng(48, 72, tile))
    decode_raw(plain, tmp_path / "plain.npy")
    decode_raw(packed, tmp_path / "ljpeg.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "ljpeg.npy"), np.load(tmp_path / "plain.npy"))

