"""The storage contract, one suite for every backend: local files, and S3 through a real HTTP endpoint on
loopback (moto in server mode, boto3 pointed at it by AWS_ENDPOINT_URL and dummy credentials)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from services.storage.base import Storage
from services.storage.local import LocalStorage
from tests.conftest import S3Server

PART = 5 << 20  # S3's smallest multipart part


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "local":
        yield LocalStorage(tmp_path / "storage")
        return
    from services.storage.s3 import S3Storage
    from services.storage.scratch import ScratchCache

    request.getfixturevalue("s3_server")
    yield S3Storage(f"contract-{uuid.uuid4().hex[:8]}", "pre/fix", ScratchCache(tmp_path / "scratch", 64 << 20),
                    part_size=PART, create_bucket=True)


def _pending_uploads(storage: Storage) -> list[object]:
    from services.storage.s3 import S3Storage

    if not isinstance(storage, S3Storage):
        return []
    return list(storage.client.list_multipart_uploads(Bucket=storage.bucket).get("Uploads", []))


def test_bytes_round_trip_and_metadata(storage: Storage) -> None:
    data = os.urandom(3000)
    with storage.writer("jobs/a/frames/00_x.dng") as f:
        f.write(data)
    assert storage.exists("jobs/a/frames/00_x.dng") and not storage.exists("jobs/a/frames/01_y.dng")
    assert storage.size("jobs/a/frames/00_x.dng") == 3000
    with storage.open("jobs/a/frames/00_x.dng") as f:
        assert f.read() == data
    with storage.open("jobs/a/frames/00_x.dng") as f:  # seekable: the upload probe reads the TIFF structure
        f.seek(1000)
        assert f.read(10) == data[1000:1010]
    assert storage.local_path("jobs/a/frames/00_x.dng").read_bytes() == data
    with pytest.raises(FileNotFoundError):
        storage.open("jobs/a/nothing")
    with pytest.raises(FileNotFoundError):
        storage.local_path("jobs/a/nothing")


def test_nothing_visible_until_the_writer_exits(storage: Storage) -> None:
    big = os.urandom(2 * PART + 12345)  # several multipart parts on S3
    with storage.writer("jobs/b/out/x.tif") as f:
        f.write(big[:PART + 10])
        assert not storage.exists("jobs/b/out/x.tif")
        f.write(big[PART + 10:])
        assert not storage.exists("jobs/b/out/x.tif")
    assert storage.size("jobs/b/out/x.tif") == len(big)
    assert b"".join(storage.iter_chunks("jobs/b/out/x.tif")) == big


def test_a_failed_writer_leaves_nothing_and_aborts_its_upload(storage: Storage) -> None:
    with pytest.raises(RuntimeError), storage.writer("jobs/c/out/x.tif") as f:
        f.write(os.urandom(PART + 100))  # a multipart upload started on S3
        raise RuntimeError("client went away")
    assert not storage.exists("jobs/c/out/x.tif")
    assert _pending_uploads(storage) == []
    with pytest.raises(RuntimeError), storage.path_writer("jobs/c/raw/00.npy") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("decoder died")
    assert not storage.exists("jobs/c/raw/00.npy")
    assert list(storage.list_sizes("jobs/c")) == []


def test_ranged_chunks(storage: Storage) -> None:
    data = bytes(range(256)) * 100
    with storage.writer("k/r.bin") as f:
        f.write(data)
    assert b"".join(storage.iter_chunks("k/r.bin", 100, 200)) == data[100:200]
    assert b"".join(storage.iter_chunks("k/r.bin", 25000)) == data[25000:]
    assert b"".join(storage.iter_chunks("k/r.bin", 0, None, chunk=1000)) == data
    assert [len(c) for c in storage.iter_chunks("k/r.bin", 0, 2500, chunk=1000)][-1] <= 1000


def test_arrays_round_trip_memory_mapped(storage: Storage) -> None:
    a = np.arange(200 * 30, dtype=np.uint16).reshape(200, 30)
    storage.save_array("jobs/d/raw/00.npy", a, durable=False)
    back = storage.load_array("jobs/d/raw/00.npy")
    assert isinstance(back, np.memmap) and np.array_equal(back, a)
    assert np.array_equal(storage.read_rows("jobs/d/raw/00.npy", 50, 70), a[50:70])
    assert np.array_equal(storage.read_rows("jobs/d/raw/00.npy", 190, 260), a[190:])
    with storage.array_writer("jobs/d/p1/frame_group_000.npy", (5, 40, 6), np.int32, durable=False) as out:
        out[:] = np.arange(5 * 40 * 6, dtype=np.int32).reshape(5, 40, 6)
        assert not storage.exists("jobs/d/p1/frame_group_000.npy")
    assert np.array_equal(storage.load_array("jobs/d/p1/frame_group_000.npy"),
                          np.arange(5 * 40 * 6, dtype=np.int32).reshape(5, 40, 6))


def test_an_array_written_as_a_stream(storage: Storage) -> None:
    """array_stream: the values in C order after the header, published on exit with a sample digest; a short
    stream is refused, nothing published."""
    blob = (np.arange(70001) % 251).astype(np.uint8)
    with storage.array_stream("jobs/d/p0/tiles.npy", blob.shape, np.uint8) as f:
        f.write(blob[:1000].tobytes())
        f.write(memoryview(blob[1000:]))
        assert not storage.exists("jobs/d/p0/tiles.npy")
    assert np.array_equal(storage.load_array("jobs/d/p0/tiles.npy"), blob)
    assert storage.exists("jobs/d/p0/tiles.npy.sample")
    with pytest.raises(ValueError, match="bytes written"), storage.array_stream("jobs/d/p0/t2.npy", (10,),
                                                                                  np.int32) as f:
        f.write(b"\0" * 12)
    assert not storage.exists("jobs/d/p0/t2.npy")


def test_file_writer_is_seekable_and_mappable(storage: Storage) -> None:
    import mmap

    with storage.file_writer("jobs/e/out/x.tif") as f:
        f.write(b"A" * 100)
        f.seek(10)
        f.write(b"B")
        f.flush()
        with mmap.mmap(f.fileno(), 100, access=mmap.ACCESS_READ) as m:
            assert m[10:11] == b"B"
        assert not storage.exists("jobs/e/out/x.tif")
    assert b"".join(storage.iter_chunks("jobs/e/out/x.tif")) == b"A" * 10 + b"B" + b"A" * 89


def test_path_writer_publishes_the_file(storage: Storage) -> None:
    with storage.path_writer("jobs/f/raw/00.npy") as tmp:
        np.save(tmp, np.ones((4, 4), np.uint16))
        assert not storage.exists("jobs/f/raw/00.npy")
    assert storage.load_array("jobs/f/raw/00.npy").sum() == 16
    big = np.arange(PART // 2 + 1000, dtype=np.uint32)  # over one part: boto3's multipart transfer on S3
    with storage.path_writer("jobs/f/raw/01.npy") as tmp:
        np.save(tmp, big)
    assert np.array_equal(storage.load_array("jobs/f/raw/01.npy"), big)


def test_move_makes_one_object_another_and_replaces_what_was_there(storage: Storage) -> None:
    """A file a worker wrote, moved into the outputs (a rename on local files, a copy on object storage)."""
    with storage.writer("jobs/m/p0/strip_000.tif") as f:
        f.write(b"worker's file")
    with storage.writer("jobs/m/out/shot.tif") as f:
        f.write(b"an earlier run's")
    storage.move("jobs/m/p0/strip_000.tif", "jobs/m/out/shot.tif")
    assert not storage.exists("jobs/m/p0/strip_000.tif")
    with storage.open("jobs/m/out/shot.tif") as f:
        assert f.read() == b"worker's file"
    storage.move("jobs/m/out/shot.tif", "jobs/m/elsewhere/deeper/shot.tif")  # folders made as needed
    assert storage.size("jobs/m/elsewhere/deeper/shot.tif") == 13
    with pytest.raises(FileNotFoundError):
        storage.move("jobs/m/p0/gone.tif", "jobs/m/out/gone.tif")


def test_delete_prefix_and_listing(storage: Storage) -> None:
    for key in ("jobs/g/raw/00.npy", "jobs/g/raw/01.npy", "jobs/g/out/x.tif", "jobs/gg/raw/00.npy"):
        with storage.writer(key) as f:
            f.write(b"12345")
    assert sorted(storage.list_sizes("jobs/g")) == [("jobs/g/out/x.tif", 5), ("jobs/g/raw/00.npy", 5),
                                                    ("jobs/g/raw/01.npy", 5)]
    storage.local_path("jobs/g/raw/00.npy")
    storage.delete_prefix("jobs/g/raw")
    assert not storage.exists("jobs/g/raw/00.npy") and storage.exists("jobs/g/out/x.tif")
    assert storage.exists("jobs/gg/raw/00.npy")  # a prefix is a folder, not a string prefix
    storage.delete_prefix("jobs/g")
    assert list(storage.list_sizes("jobs/g")) == [] and storage.exists("jobs/gg/raw/00.npy")
    storage.delete_prefix("jobs/nothing-here")


def test_last_modified(storage: Storage) -> None:
    import time

    before = time.time() - 5  # an object store's clock and stamps (whole seconds) are not this process's
    with storage.writer("jobs/m/frames/00.dng") as f:
        f.write(b"12345")
    stamp = storage.last_modified("jobs/m")
    assert stamp is not None and before <= stamp <= time.time() + 5
    assert storage.last_modified("jobs/m/frames/00.dng") == stamp
    assert storage.last_modified("jobs/nothing-here") is None


def test_presigned_url(storage: Storage) -> None:
    import httpx

    with storage.writer("jobs/h/out/x.tif") as f:
        f.write(b"tiff bytes")
    disposition = "attachment; filename=\"x.tif\"; filename*=UTF-8''%E5%86%99.tif"
    url = storage.presigned_url("jobs/h/out/x.tif", 60, disposition=disposition, content_type="image/tiff")
    if isinstance(storage, LocalStorage):
        assert url is None
        return
    assert url is not None
    r = httpx.get(url)
    assert r.status_code == 200 and r.content == b"tiff bytes"
    assert r.headers["content-type"] == "image/tiff" and r.headers["content-disposition"] == disposition


def test_presigned_urls_are_signed_for_the_public_endpoint(s3_server: S3Server, tmp_path: Path) -> None:
    """STRATA_S3_PUBLIC_ENDPOINT: the service reaches the store at one address (docker-compose: http://minio:9000),
    stations at another; a signature covers the host, so the URL is signed for the stations' address."""
    import httpx

    from services.storage.s3 import S3Storage
    from services.storage.scratch import ScratchCache

    public = s3_server.endpoint.replace("127.0.0.1", "localhost")
    storage = S3Storage(f"public-{uuid.uuid4().hex[:8]}", "p", ScratchCache(tmp_path / "scratch", 1 << 20),
                        part_size=PART, create_bucket=True, public_endpoint=public)
    with storage.writer("jobs/h/out/x.tif") as f:
        f.write(b"tiff bytes")
    url = storage.presigned_url("jobs/h/out/x.tif", 60)
    assert url is not None and url.startswith(public + "/")
    r = httpx.get(url)
    assert r.status_code == 200 and r.content == b"tiff bytes"  # (moto does not check signatures; MinIO does)


def test_scratch_cache_is_bounded(s3_server: S3Server, tmp_path: Path) -> None:
    """Objects read as files land in the scratch cache once; least recently used ones go past the cap."""
    from services.storage.s3 import S3Storage
    from services.storage.scratch import ScratchCache

    cache = ScratchCache(tmp_path / "scratch", 3 << 20, grace_s=0)
    storage = S3Storage(f"scratch-{uuid.uuid4().hex[:8]}", "", cache, part_size=PART, create_bucket=True)
    for i in range(5):
        with storage.writer(f"k/{i}.bin") as f:
            f.write(bytes([i]) * (1 << 20))
    first = storage.local_path("k/0.bin")
    assert storage.local_path("k/0.bin") == first  # cached: no second download
    for i in range(1, 5):
        time.sleep(0.01)
        storage.local_path(f"k/{i}.bin")
    assert cache.used_bytes() <= 3 << 20
    assert not first.exists() and storage.local_path("k/4.bin").exists()
    assert storage.local_path("k/0.bin").read_bytes() == b"\x00" * (1 << 20)  # downloaded again
    with storage.writer("k/0.bin") as f:  # a new version is re-validated by its ETag
        f.write(b"new")
    assert storage.local_path("k/0.bin").read_bytes() == b"new"


def test_a_tiff_of_gpu_tiles_is_written_in_one_pass_and_hashed_as_stored(storage: Storage) -> None:
    """The laid-out TIFF (GPU tile streams written front to back, hashed beside the write) goes to either backend
    as one stream (on S3 a multipart upload of several parts, no scratch file): the stored object is a TIFF of the
    image, and the returned hash and size are the object's."""
    import hashlib
    import io

    import tifffile

    from services.export.tiff import write_tiff
    from services.pipeline import tiles

    rng = np.random.default_rng(7)
    img = rng.integers(0, 65535, (1400, 1800, 3), dtype=np.uint16)
    bands = [(0, img[:900]), (900, img[900:])]  # off the tile grid: the writer compresses the straddling row
    pretiled = [tiles.cpu_tile_streams(rows, y0, img.shape[0]) for y0, rows in bands]
    sha, size = write_tiff(storage, "jobs/t/out/x.tif", bands, compression="deflate", pretiled=pretiled)
    with storage.open("jobs/t/out/x.tif") as f:
        data = f.read()
    assert size > 2 * PART and (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        np.testing.assert_array_equal(tif.pages[0].asarray(), img)
    assert _pending_uploads(storage) == []
