"""write_tiff: the file round-trips, its sha256 is that of the stored bytes, with or without a mappable writer."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest
import tifffile

from services.export.tiff import write_tiff
from services.storage.local import LocalStorage


class WriteOnlyStorage(LocalStorage):
    """A backend whose writer cannot be read back (as a network stream would be)."""

    @contextmanager
    def writer(self, key: str, durable: bool = True) -> Iterator[BinaryIO]:
        with self.path_writer(key) as tmp, open(tmp, "wb") as f:
            yield f


@pytest.mark.parametrize("compression", ["deflate", "zstd", None])
@pytest.mark.parametrize("backend", [LocalStorage, WriteOnlyStorage])
def test_round_trip_and_digest(tmp_path: Path, compression: str | None, backend: type[LocalStorage]) -> None:
    rgb = np.random.default_rng(3).integers(0, 65535, (300, 520, 3)).astype(np.uint16)
    storage = backend(tmp_path)
    sha, size = write_tiff(storage, "out/a.tif", rgb, compression=compression, threads=2)
    data = (tmp_path / "out" / "a.tif").read_bytes()
    assert size == len(data) and sha == hashlib.sha256(data).hexdigest()
    with tifffile.TiffFile(tmp_path / "out" / "a.tif") as tif:
        np.testing.assert_array_equal(tif.asarray(), rgb)
        codes = {"deflate": 8, "zstd": 50000, None: 1}
        assert tif.pages[0].is_tiled and tif.pages[0].compression == codes[compression]
        assert tif.pages[0].predictor == (2 if compression == "deflate" else 1)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a.tif"]  # no temporary left behind


@pytest.mark.parametrize("compression", ["deflate", "zstd", None])
def test_bands_write_the_same_file_as_the_stitched_image(tmp_path: Path, compression: str | None) -> None:
    rgb = np.random.default_rng(4).integers(0, 65535, (477, 520, 3)).astype(np.uint16)
    storage = LocalStorage(tmp_path)
    whole = write_tiff(storage, "whole.tif", rgb, compression=compression, threads=2)
    cuts = [0, 100, 400, 477]  # bands straddle tile rows; the last tile row and column are partial
    bands = [(a, rgb[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert write_tiff(storage, "bands.tif", bands, compression=compression, threads=2) == whole
    assert (tmp_path / "bands.tif").read_bytes() == (tmp_path / "whole.tif").read_bytes()
    with pytest.raises(ValueError, match="consecutive"):
        write_tiff(storage, "bad.tif", [(0, rgb[:100]), (150, rgb[150:])])


def test_deflate_tiles_are_standard_adobe_deflate_with_the_predictor(tmp_path: Path) -> None:
    """Tiles compressed on our threads (libdeflate) read back exactly, edge tiles included, as a plain reader
    sees them: Compression 8, Predictor 2."""
    import tifffile

    from services.export.tiff import write_tiff
    from services.storage.local import LocalStorage

    rng = np.random.default_rng(4)
    for dtype, top in ((np.uint16, 65535), (np.uint8, 255)):
        img = rng.integers(0, top, (300, 517, 3), dtype=dtype)
        storage = LocalStorage(tmp_path / np.dtype(dtype).name)
        write_tiff(storage, "x.tif", [(0, img[:130]), (130, img[130:])], compression="deflate", threads=3)
        with tifffile.TiffFile(storage.local_path("x.tif")) as tif:
            page = tif.pages.first
            assert int(page.compression) == 8 and int(page.predictor) == 2 and page.is_tiled
            np.testing.assert_array_equal(page.asarray(), img)
