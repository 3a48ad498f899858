"""Preview maths and JSON log lines, on small real arrays."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from services.logs import JsonFormatter
from services.pipeline.preview import bin_mosaic, bin_shift, mosaic_preview, srgb_encode, strips_preview


@pytest.mark.parametrize(("factor", "threads"), [(1, 1), (2, 2), (3, 1), (3, 4), (4, 3), (5, 2), (8, 2)])
def test_binning_means_each_cfa_site_over_its_block(factor: int, threads: int) -> None:
    """16-bit lanes never overflow, even for full-scale samples, and the means are exact to within half the
    dropped low bits (after the truncation's mean is added back)."""
    rng = np.random.default_rng(factor)
    block = 2 * factor
    h, w = 700 // block, 1000 // block
    mosaic = rng.integers(0, 65536, (700, 1000), dtype=np.uint16)
    mosaic[:block, :block] = 65535  # a saturated block
    got = bin_mosaic(mosaic, factor, threads)  # the rest of the rows and columns dropped
    assert got.shape == (h, w, 4)
    half_step = (1 << bin_shift(factor)) / 2
    for site, (p, q) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        plane = mosaic[: h * block, : w * block][p::2, q::2].astype(np.float64)
        want = plane.reshape(h, factor, w, factor).mean(axis=(1, 3))
        np.testing.assert_allclose(got[..., site], want, atol=half_step + 0.01)
    assert abs(float(got[0, 0, 0]) - 65535) <= half_step


def test_a_grey_card_previews_neutral_grey_and_fits_the_long_edge() -> None:
    mosaic = np.full((4000, 6000), 512 + int(0.18 * (16383 - 512)), dtype=np.uint16)
    rgb = mosaic_preview(mosaic, cfa="GRBG", black=(512.0,) * 4, white=16383.0, gains=(1.0, 1.0, 1.0),
                         srgb_from_wb_cam=np.eye(3), long_edge=1600)
    assert rgb.dtype == np.uint8 and rgb.shape == (1067, 1600, 3)  # the long edge exactly, the aspect kept
    assert np.ptp(rgb) == 0 and abs(int(rgb[0, 0, 0]) - 118) <= 1  # 18 % grey is sRGB 118


def test_srgb_table_matches_the_curve() -> None:
    x = np.linspace(0, 1, 10001, dtype=np.float32)
    exact = np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055) * 255
    assert np.abs(srgb_encode(x).astype(np.float64) - exact).max() <= 1.0


def test_strip_preview_joins_strips_across_block_edges() -> None:
    image = np.arange(40 * 30 * 3, dtype=np.uint16).reshape(40, 30, 3) * 50
    bands = [(0, image[:13]), (13, image[13:27]), (27, image[27:])]
    assert np.array_equal(strips_preview(bands, long_edge=10), strips_preview([(0, image)], long_edge=10))


def test_json_log_lines_carry_job_and_shard_ids() -> None:
    job = "a" * 32
    record = logging.LogRecord("strata", logging.INFO, __file__, 1, "shard %s/0/3 done on %s", (job, "gpu0"), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["shard_id"] == f"{job}/0/3" and line["level"] == "INFO"
    record = logging.LogRecord("strata", logging.INFO, __file__, 1, "job %s ingested", (job,), None)
    assert json.loads(JsonFormatter().format(record))["job_id"] == job


@pytest.mark.parametrize("cfa", ["RGGB", "GRBG", "GBRG", "BGGR"])
def test_the_fast_preview_colour_follows_the_plain_formula(cfa: str) -> None:
    """Means per site, black levels off, greens averaged, clipped, gains, the shot's matrix, clipped, sRGB: the
    fast preview within one 8-bit level of it (its output size is the frame's, fitted to the long edge)."""
    rng = np.random.default_rng(7)
    mosaic = rng.integers(400, 16000, (240, 300), dtype=np.uint16)
    black, white, gains = (500.0, 510.0, 505.0, 495.0), 16383.0, (1.9, 1.0, 1.4)
    matrix = np.array([[1.6, -0.4, -0.2], [-0.2, 1.5, -0.3], [0.05, -0.5, 1.45]])
    got = mosaic_preview(mosaic, cfa=cfa, black=black, white=white, gains=gains, srgb_from_wb_cam=matrix,
                         long_edge=50)
    means = bin_mosaic(mosaic, 3)  # 240 / 6 = 40 rows, 300 / 6 = 50 columns: no resampling at long edge 50
    assert got.shape == (40, 50, 3)
    cam = np.zeros((40, 50, 3))
    for i, colour in enumerate(cfa):
        cam[..., "RGB".index(colour)] += (means[..., i] - black[i]) / (white - max(black)) * (
            0.5 if colour == "G" else 1.0)
    linear = np.clip(np.clip(cam, 0, 1) * np.asarray(gains) @ matrix.T, 0, 1)
    want = srgb_encode(linear.astype(np.float32))
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
