"""Host <-> device copies (the CPU path here; the CUDA path is checked on the GPU by scripts/gpu/check_stack.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from services.pipeline.transfer import download, prefault, upload


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
    blob = np.arange(1000, dtype=np.int64).astype(np.uint8)  # tile streams
    out = np.zeros_like(blob)
    assert download(upload(blob, torch.device("cpu")), out) is out and np.array_equal(out, blob)


def test_transfer_refuses_other_dtypes() -> None:
    with pytest.raises(TypeError, match="int32, uint16 or uint8"):
        upload(np.zeros(4, np.float32), torch.device("cpu"))


@pytest.mark.parametrize("size", [1, 5, 13, 1000])
@pytest.mark.parametrize("slots", [1, 3])
def test_staging_covers_crops_in_order(size: int, slots: int) -> None:
    # The CUDA path's staging loops, run with a numpy "device" and real copy threads: every element crosses
    # once, in C order, and no slot is reused before its copy is done.
    from concurrent.futures import ThreadPoolExecutor

    from services.pipeline.transfer import _stage_in, _stage_out

    a = np.arange(3 * 11 * 7, dtype=np.int32).reshape(3, 11, 7)
    bufs = [np.empty(size, np.int32) for _ in range(slots)]
    with ThreadPoolExecutor(slots) as pool:
        for part in (a, a[:, 2:9], a[:, :10, :6], a[0, :, :5]):
            device = np.full(part.size, -1, np.int32)

            def flush(offset: int, n: int, s: int, device: np.ndarray = device) -> None:
                device[offset : offset + n] = bufs[s][:n]
                bufs[s][:n] = -2  # the slot is free again: a late host copy would show up as -2

            _stage_in(part, bufs, flush, pool)
            np.testing.assert_array_equal(device.reshape(part.shape), part)

            back = np.full(part.size, -1, np.int32)

            def fetch(offset: int, n: int, s: int, device: np.ndarray = device) -> None:
                bufs[s][:n] = device[offset : offset + n]

            def put(at: int, got: np.ndarray, back: np.ndarray = back) -> None:
                np.copyto(back[at : at + got.size], got)

            _stage_out(back.size, bufs, fetch, put, pool)
            np.testing.assert_array_equal(back.reshape(part.shape), part)
            stream: list[bytes] = []  # in order on this thread (a file written as a stream)
            _stage_out(back.size, bufs, fetch, lambda _at, got, stream=stream: stream.append(got.tobytes()), None)
            assert b"".join(stream) == np.ascontiguousarray(part).tobytes()


def test_prefault_touches_a_fresh_memory_map_and_the_real_bytes_follow(tmp_path: Path) -> None:
    out = np.lib.format.open_memmap(tmp_path / "acc.npy", mode="w+", dtype=np.int32, shape=(4, 37, 1029))
    out[:] = 7  # a map that held something: prefault leaves zeros, the caller's write comes after the wait
    wait = prefault(out)
    wait()
    assert not out.any()
    values = np.arange(out.size, dtype=np.int32).reshape(out.shape)
    download(torch.from_numpy(values), out)
    np.testing.assert_array_equal(np.load(tmp_path / "acc.npy"), values)
    with pytest.raises(ValueError, match="writable C-contiguous"):
        prefault(values[:, :, ::2])


@pytest.mark.parametrize("slots", [1, 3])
def test_each_consumer_takes_every_slot_in_order_before_the_slot_is_filled_again(slots: int) -> None:
    """download_each's loop with a numpy "device": a slow consumer and a fast one (a file's hash and its write,
    each on a thread of its own) both get every byte in order; a slot refilled before both took it would show."""
    import hashlib
    import time

    from services.pipeline.transfer import _stage_each

    device = np.arange(1000, dtype=np.uint16) * 7
    bufs = [np.empty(64, np.uint16) for _ in range(slots)]

    def fetch(offset: int, n: int, s: int) -> None:
        bufs[s][:n] = device[offset : offset + n]

    written: list[bytes] = []
    digest = hashlib.sha256()

    def slow(part: memoryview) -> None:
        time.sleep(0.002)
        digest.update(part)

    _stage_each(device.size, bufs, fetch, [lambda part: written.append(bytes(part)), slow])
    assert b"".join(written) == device.tobytes()
    assert digest.hexdigest() == hashlib.sha256(device.tobytes()).hexdigest()

    def failing(part: memoryview) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _stage_each(device.size, bufs, fetch, [failing, slow])
