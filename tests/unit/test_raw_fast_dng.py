"""The fast path for uncompressed Bayer DNGs gives exactly what the LibRaw child gives, or declines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile

from lab.synth.synth import COLOR_MATRIX, synthesize_shot
from services.pipeline.preview import MosaicBinner, bin_factor
from services.raw.colour import CameraProfile
from services.raw.decode import decode_raw
from services.raw.dng import PHOTOMETRIC_CFA, dng_tags
from services.raw.fast_dng import TAG_ACTIVE_AREA, decode_fast
from services.raw.meta import NoiseProfile


def _both(path: Path, tmp: Path) -> tuple[object, np.ndarray, object, np.ndarray]:
    fast = decode_fast(path, tmp / "fast.npy")
    child = decode_raw(path, tmp / "child.npy", fast_dng=False)
    return fast, np.load(tmp / "fast.npy"), child, np.load(tmp / "child.npy")


@pytest.mark.parametrize("cfa", ["RGGB", "BGGR", "GRBG", "GBRG"])
def test_fast_path_equals_libraw_on_synthetic_frames(tmp_path: Path, cfa: str) -> None:
    shot = synthesize_shot("IQ3_S", tmp_path / "shot", scale=0.02, cfa=cfa, noise="mid")
    fast, fast_px, child, child_px = _both(shot.files[0], tmp_path)
    assert fast == child
    assert fast_px.dtype == np.uint16 and np.array_equal(fast_px, child_px)


def _write_with_active_area(path: Path, mosaic: np.ndarray, area: tuple[int, int, int, int], byteorder: str,
                            **tag_args: object) -> None:
    tags = dng_tags(cfa="GRBG", black_level=512, white_level=60000, profile=CameraProfile(COLOR_MATRIX),
                    as_shot_neutral=(0.5, 1.0, 0.7), make="Phase One", model="IQ3 100MP",
                    noise_profile=NoiseProfile(1e-4, 1e-6), **tag_args)  # type: ignore[arg-type]
    tags.append((TAG_ACTIVE_AREA, "I", 4, area, True))
    with tifffile.TiffWriter(path, byteorder=byteorder) as tif:  # type: ignore[arg-type]
        tif.write(mosaic, photometric=PHOTOMETRIC_CFA, compression=None, subfiletype=0, software=False,
                  metadata=None, extratags=tags)


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_fast_path_crops_the_active_area_like_libraw(tmp_path: Path, byteorder: str) -> None:
    rng = np.random.default_rng(3)
    mosaic = rng.integers(500, 60000, (70, 90), dtype=np.uint16)
    _write_with_active_area(tmp_path / "a.dng", mosaic, (4, 6, 68, 86), byteorder)
    fast, fast_px, child, child_px = _both(tmp_path / "a.dng", tmp_path)
    assert fast is not None and fast.cfa == child.cfa and (fast.width, fast.height) == (80, 64)  # type: ignore[attr-defined]
    assert fast == child
    assert np.array_equal(fast_px, child_px) and np.array_equal(fast_px, mosaic[4:68, 6:86])


def test_fast_path_declines_what_needs_libraw(tmp_path: Path) -> None:
    mosaic = np.full((32, 32), 1000, np.uint16)
    tags = dng_tags(cfa="RGGB", black_level=0, white_level=65535, profile=CameraProfile(COLOR_MATRIX),
                    as_shot_neutral=(0.5, 1.0, 0.7), make="X", model="Y", noise_profile=None)
    compressed = tmp_path / "deflate.dng"
    with tifffile.TiffWriter(compressed) as tif:
        tif.write(mosaic, photometric=PHOTOMETRIC_CFA, compression="zlib", subfiletype=0, metadata=None,
                  extratags=tags)
    assert decode_fast(compressed, tmp_path / "x.npy") is None and not (tmp_path / "x.npy").exists()
    not_dng = tmp_path / "plain.tif"
    tifffile.imwrite(not_dng, mosaic)
    assert decode_fast(not_dng, tmp_path / "y.npy") is None
    (tmp_path / "junk.dng").write_bytes(b"II*\x00" + b"\x00" * 64)
    assert decode_fast(tmp_path / "junk.dng", tmp_path / "z.npy") is None
    odd = tmp_path / "odd.dng"  # LibRaw trims odd ActiveArea origins its own way: left to LibRaw
    _write_with_active_area(odd, np.full((40, 40), 900, np.uint16), (3, 5, 37, 35), "<")
    assert decode_fast(odd, tmp_path / "o.npy") is None


@pytest.mark.parametrize(("byteorder", "threads"), [("<", 1), ("<", 3), (">", 4)])
def test_fast_path_copies_in_bands_and_bins_for_the_preview_on_the_way(tmp_path: Path, byteorder: str,
                                                                       threads: int) -> None:
    """The threaded band copy gives the same mosaic, and the preview's bin sums made during it equal binning the
    decoded mosaic afterwards (a band height that does not divide the frame, an ActiveArea offset)."""
    rng = np.random.default_rng(5)
    mosaic = rng.integers(500, 60000, (1210, 3400), dtype=np.uint16)
    _write_with_active_area(tmp_path / "a.dng", mosaic, (2, 4, 1206, 3398), byteorder)
    binner = MosaicBinner(long_edge=400)
    meta = decode_fast(tmp_path / "a.dng", tmp_path / "fast.npy", threads=threads, binner=binner)
    assert meta is not None and binner.ready and binner.factor == bin_factor(1204, 3394, 400) == 4
    got = np.load(tmp_path / "fast.npy")
    assert np.array_equal(got, mosaic[2:1206, 4:3398])
    assert np.array_equal(binner.sums, MosaicBinner(long_edge=400).feed(got, threads=2).sums)  # type: ignore[arg-type]


def test_a_binner_is_not_ready_when_libraw_decodes(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ3_S", tmp_path / "shot", scale=0.02, noise="mid")
    binner = MosaicBinner()
    decode_raw(shot.files[0], tmp_path / "child.npy", fast_dng=False, binner=binner)
    assert not binner.ready
