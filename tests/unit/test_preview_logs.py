"""Preview maths and JSON log lines, on small real arrays."""

from __future__ import annotations

import json
import logging

import numpy as np

from services.logs import JsonFormatter
from services.pipeline.preview import bin_mosaic, mosaic_preview, srgb_encode, strips_preview


def test_binning_means_each_cfa_site_over_its_block() -> None:
    rng = np.random.default_rng(0)
    mosaic = rng.integers(0, 4000, (50, 70), dtype=np.uint16)
    got = bin_mosaic(mosaic, 3)  # blocks of 6x6: 8 x 11, the rest dropped
    assert got.shape == (8, 11, 4)
    for site, (p, q) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        plane = mosaic[:48, :66][p::2, q::2].astype(np.float64)
        want = plane.reshape(8, 3, 11, 3).mean(axis=(1, 3))
        np.testing.assert_allclose(got[..., site], want, rtol=1e-6)


def test_a_grey_card_previews_neutral_grey_and_fits_the_long_edge() -> None:
    mosaic = np.full((4000, 6000), 512 + int(0.18 * (16383 - 512)), dtype=np.uint16)
    rgb = mosaic_preview(mosaic, cfa="GRBG", black=(512.0,) * 4, white=16383.0, gains=(1.0, 1.0, 1.0),
                         srgb_from_wb_cam=np.eye(3), long_edge=1600)
    assert rgb.dtype == np.uint8 and max(rgb.shape[:2]) >= 1600 and max(rgb.shape[:2]) < 3200
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
