"""Host <-> device copies (the CPU path here; the CUDA path is checked on the GPU by scripts/gpu/check_stack.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from services.pipeline.transfer import download, upload


def test_upload_takes_slices_of_read_only_memory_maps(tmp_path: Path) -> None:
    a = np.arange(3 * 40 * 30, dtype=np.int32).reshape(3, 40, 30)
    np.save(tmp_path / "a.npy", a)
    mm = np.load(tmp_path / "a.npy", mmap_mode="r")
    for part in (mm, mm[:, 5:17]):
        t = upload(part, torch.device("cpu"))
        assert t.dtype == torch.int32
        np.testing.assert_array_equal(download(t), np.asarray(part))
    u = a[0].astype(np.uint16)
    assert upload(u, torch.device("cpu")).dtype == torch.uint16


def test_transfer_refuses_other_dtypes() -> None:
    with pytest.raises(TypeError, match="int32 or uint16"):
        upload(np.zeros(4, np.float32), torch.device("cpu"))


@pytest.mark.parametrize("size", [1, 5, 13, 1000])
def test_staging_covers_crops_in_order(size: int) -> None:
    # The CUDA path's staging loop, run with a numpy "device": every element lands once, in C order.
    from services.pipeline.transfer import _stage

    a = np.arange(3 * 11 * 7, dtype=np.int32).reshape(3, 11, 7)
    for part in (a, a[:, 2:9], a[:, :10, :6], a[0, :, :5]):
        out = np.full(part.size, -1, np.int32)
        staging = np.empty(size, np.int32)

        def flush(offset: int, n: int, out: np.ndarray = out, staging: np.ndarray = staging) -> None:
            out[offset : offset + n] = staging[:n]

        _stage(part, staging, flush)
        np.testing.assert_array_equal(out.reshape(part.shape), part)
