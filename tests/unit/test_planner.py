"""Planner, camera profiles, recipes and local storage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.errors import BadInput, UnknownCamera
from services.export.recipes import get_recipe
from services.jobs.cameras import resolve_camera
from services.jobs.planner import parse_split_ratio, plan_frame_groups, plan_strips, strip_count
from services.storage.local import LocalStorage


@pytest.mark.parametrize("height,n", [(1030, 4), (10304, 8), (7, 3), (2, 5), (1288, 1), (999, 7)])
def test_strips_cover_the_frame_on_even_cuts(height: int, n: int) -> None:
    strips = plan_strips(height, n)
    assert strips[0][0] == 0 and strips[-1][1] == height
    assert all(a[1] == b[0] for a, b in zip(strips, strips[1:], strict=False))
    assert all(y0 % 2 == 0 and y1 > y0 for y0, y1 in strips)
    assert len(strips) == min(n, height // 2)


def test_seed_split_is_eight_strips_of_1288_rows() -> None:
    n = strip_count(10304, 1288, n_workers=2, per_worker=2)
    assert n == 8 and {y1 - y0 for y0, y1 in plan_strips(10304, n)} == {1288}


def test_split_ratio_sizes_strips_and_groups() -> None:
    ratios = parse_split_ratio("0.6, 0.4")
    assert ratios == pytest.approx([0.6, 0.4])
    (a0, a1), (b0, b1) = plan_strips(10304, 2, ratios)
    assert (a1 - a0) == 6182 and (b1 - b0) == 4122
    assert plan_frame_groups(8, 2, [0.5, 0.5]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert plan_frame_groups(8, 2, ratios) == [[0, 1, 2, 3, 4], [5, 6, 7]]


@pytest.mark.parametrize("text", ["a,b", "0.5,-1", "0", "nan,1"])
def test_bad_split_ratio(text: str) -> None:
    with pytest.raises(BadInput):
        parse_split_ratio(text)


def test_frame_groups_never_cut_frames_and_keep_the_reference_first() -> None:
    for n_frames in range(2, 17):
        for n_groups in range(1, 6):
            groups = plan_frame_groups(n_frames, n_groups)
            assert sorted(i for g in groups for i in g) == list(range(n_frames))
            assert groups[0][0] == 0 and len(groups) == min(n_frames, n_groups)


def test_camera_resolution() -> None:
    assert resolve_camera(None, ["Phase One IQ3_S"], 1).name == "IQ3_S"
    assert resolve_camera(None, ["Phase One IQ2_XS"] * 4, 4).name == "IQ2_XS"
    assert resolve_camera(None, ["Canon EOS R5"], 1).name == "IQ3_S"  # other backs: by frame count
    assert resolve_camera(None, ["Canon EOS R5"] * 3, 3).name == "IQ2_XS"
    # a detected back whose frame count does not fit: by the count (one IQ2_XS frame is a single frame)
    assert resolve_camera(None, ["Phase One IQ2_XS"], 1).name == "IQ3_S"
    assert resolve_camera(None, ["Phase One IQ3_S"] * 4, 4).name == "IQ2_XS"
    with pytest.raises(BadInput, match="takes 2-16 frame"):
        resolve_camera("IQ2_XS", ["Phase One IQ2_XS"], 1)  # asked for: refused
    assert resolve_camera("iq2_xs", [""] * 2, 2).name == "IQ2_XS"
    with pytest.raises(UnknownCamera):
        resolve_camera("IQ4", [""], 1)
    with pytest.raises(BadInput, match="takes 1 frame"):
        resolve_camera("IQ3_S", ["", ""], 2)
    with pytest.raises(BadInput, match="2-16"):
        resolve_camera("IQ2_XS", [""] * 17, 17)


def test_recipes() -> None:
    assert get_recipe(None).name == "tiff16"
    with pytest.raises(BadInput, match="unknown recipe"):
        get_recipe("png8")


def test_local_storage_is_atomic(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    with pytest.raises(RuntimeError), storage.writer("jobs/a/x.bin") as f:
        f.write(b"partial")
        raise RuntimeError("crash mid-write")
    assert not storage.exists("jobs/a/x.bin")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    storage.save_array("jobs/a/arr.npy", np.arange(12, dtype=np.uint16).reshape(3, 4))
    loaded = storage.load_array("jobs/a/arr.npy")
    assert isinstance(loaded, np.memmap) and loaded[2, 3] == 11
    assert b"".join(storage.iter_chunks("jobs/a/arr.npy", 0, 6, chunk=4)) == storage.open("jobs/a/arr.npy").read(6)
    with pytest.raises(ValueError):
        storage.exists("../escape")
    storage.delete_prefix("jobs/a")
    assert not storage.exists("jobs/a/arr.npy")


def test_storage_knows_local_from_shared_filesystems() -> None:
    from services.storage.local import mount_type

    mounts = ("/dev/vda / ext4 rw 0 0\nserver:/export /mnt/strata nfs4 rw 0 0\n"
              "tmpfs /mnt/strata/scratch tmpfs rw 0 0\n/dev/sdb /mnt/strata\\040b xfs rw 0 0\n")
    assert mount_type(Path("/var/lib/strata"), mounts) == "ext4"
    assert mount_type(Path("/mnt/strata/jobs"), mounts) == "nfs4"
    assert mount_type(Path("/mnt/strata/scratch/x"), mounts) == "tmpfs"
    assert mount_type(Path("/mnt/strata b/x"), mounts) == "xfs"
    assert mount_type(Path("/mnt/stratax"), mounts) == "ext4"


def test_memory_mapped_arrays_carry_a_sample_digest(tmp_path: Path) -> None:
    """Unsynced memory-mapped writes can come back from a host crash full-size with holes of zeros: the reader
    notices through the sample digest published beside the array."""
    storage = LocalStorage(tmp_path)
    values = np.arange(4 * 300 * 200, dtype=np.int32).reshape(4, 300, 200) + 1
    with storage.array_writer("jobs/a/g.npy", values.shape, np.int32, durable=False) as out:
        out[:] = values
    np.testing.assert_array_equal(storage.load_array("jobs/a/g.npy"), values)
    path = storage.local_path("jobs/a/g.npy")
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 65536] = bytes(65536)  # a page range never written back
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sample digest"):
        storage.load_array("jobs/a/g.npy")
    storage.local_path("jobs/a/g.npy.sample").write_bytes(b"")  # the digest's own data lost
    with pytest.raises(ValueError, match="sample digest"):
        storage.load_array("jobs/a/g.npy")


def test_a_lean_array_samples_only_the_rows_it_wrote(tmp_path: Path) -> None:
    """A lean strip leaves rows unwritten on purpose (holes of a sparse file): its digest samples the rows it wrote,
    the reader samples the same rows, and a hole inside them is still noticed."""
    storage = LocalStorage(tmp_path)
    values = np.arange(40 * 300 * 3, dtype=np.uint16).reshape(40, 300, 3) + 1
    kept = [(0, 6), (30, 40)]
    with storage.array_writer("jobs/a/s.npy", values.shape, np.uint16, durable=False, written=lambda: kept) as out:
        for a, b in kept:
            out[a:b] = values[a:b]
    assert storage.local_path("jobs/a/s.npy.sample").read_text().startswith("rows 0:6,30:40 ")
    loaded = storage.load_array("jobs/a/s.npy")
    np.testing.assert_array_equal(loaded[30:40], values[30:40])
    assert not loaded[6:30].any()
    path = storage.local_path("jobs/a/s.npy")
    data = bytearray(path.read_bytes())
    row = 300 * 3 * 2
    data[len(data) - 5 * row : len(data) - 3 * row] = bytes(2 * row)  # a hole inside the written rows
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sample digest"):
        storage.load_array("jobs/a/s.npy")


def test_strips_are_sized_from_the_gpu_memory_budget() -> None:
    from services.jobs.planner import DEFAULT_STRIP_ROWS, MAX_STRIP_PIXELS, STRIP_BYTES_PER_PIXEL, strip_rows_for

    assert strip_rows_for(7728, 0, 0, stack=False) == DEFAULT_STRIP_ROWS  # no figure: the default
    assert strip_rows_for(7728, 0, 1001, stack=False) == 1000  # configured wins, even
    rows = strip_rows_for(7728, 20_000, 0, stack=False)
    assert rows % 2 == 0 and rows == 20_000 * 2**20 // (7728 * STRIP_BYTES_PER_PIXEL["frame"]) // 2 * 2
    assert strip_rows_for(7728, 20_000, 0, stack=True) < rows  # a stack strip needs more per pixel
    assert strip_rows_for(7728, 100_000, 0, stack=False) == MAX_STRIP_PIXELS // 7728 // 2 * 2  # the index cap
    assert strip_rows_for(7728, 100_000, 0, stack=False) >= 10304  # an 80 MP IQ3_S frame is still one strip
    assert strip_rows_for(7728, 1, 0, stack=False) == 2  # never fewer than one CFA row pair


def test_a_strip_that_runs_out_of_device_memory_is_rendered_in_halves() -> None:
    import numpy as np
    import torch

    from services.pipeline.shards import split_on_oom

    calls: list[tuple[int, int]] = []

    def render(y0: int, y1: int, into: list[np.ndarray], ready: object, on_device: object = None) -> None:
        calls.append((y0, y1))
        if y1 - y0 > 25:
            raise torch.cuda.OutOfMemoryError("no room")
        into[0][:] = np.arange(y0, y1)
        into[1][:] = -np.arange(y0, y1)  # two output spaces

    outs = [np.zeros(100, np.int64), np.zeros(100, np.int64)]
    split_on_oom(render, 10, 110, outs)
    assert np.array_equal(outs[0], np.arange(10, 110)) and np.array_equal(outs[1], -np.arange(10, 110))
    assert all(a % 2 == 0 for a, _ in calls)  # every cut on an even row
