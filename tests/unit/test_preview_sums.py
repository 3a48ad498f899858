"""The final preview from block sums made beside the strips (a GPU worker's) is the preview from the strips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.pipeline.binning import bin_rows_in, preview_sums
from services.pipeline.preview import preview_factor, strips_preview


@pytest.mark.parametrize("cuts", [(), (120,), (96, 240)])
def test_premade_block_sums_give_the_same_preview_bytes(cuts: tuple[int, ...]) -> None:
    rng = np.random.default_rng(7)
    height, width = 341, 517
    image = rng.integers(0, 65536, (height, width, 3), dtype=np.uint16)
    edges = [0, *cuts, height]
    bands = [(a, image[a:b]) for a, b in zip(edges, edges[1:], strict=False)]
    f = preview_factor(height, width, long_edge=60)
    assert f == 8
    reference = strips_preview(bands, long_edge=60, threads=2)
    premade = [(bin_rows_in(a, a + rows.shape[0], f).start, preview_sums(torch.from_numpy(rows.copy()), a, f))
               for a, rows in bands]  # a tensor, as on a worker's device
    host = [(bin_rows_in(a, a + rows.shape[0], f).start, preview_sums(rows, a, f)) for a, rows in bands]
    assert all(np.array_equal(p[1], q[1]) for p, q in zip(premade, host, strict=True))
    assert np.array_equal(strips_preview(bands, long_edge=60, premade=premade), reference)
    assert np.array_equal(strips_preview(bands, long_edge=60, premade=premade[:-1]), reference)  # incomplete: summed
