"""get_storage's choice from STRATA_STORAGE_URL, and the S3 URL's parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config import Settings
from services.storage import LocalStorage, storage_from_settings
from services.storage.s3 import parse_s3_url


def test_unset_or_file_url_is_local(tmp_path: Path) -> None:
    default = storage_from_settings(Settings(data_dir=tmp_path))
    assert isinstance(default, LocalStorage) and default.root == (tmp_path / "storage").resolve()
    chosen = storage_from_settings(Settings(data_dir=tmp_path, storage_url=f"file://{tmp_path / 'elsewhere'}"))
    assert isinstance(chosen, LocalStorage) and chosen.root == (tmp_path / "elsewhere").resolve()
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        storage_from_settings(Settings(data_dir=tmp_path, storage_url="ftp://x"))


def test_s3_urls() -> None:
    assert parse_s3_url("s3://strata/studio/a/") == ("strata", "studio/a")
    assert parse_s3_url("s3://strata") == ("strata", "")
    with pytest.raises(ValueError):
        parse_s3_url("s3:///x")


def test_node_name_names_this_host(tmp_path: Path) -> None:
    from workers.launcher import worker_specs

    specs = worker_specs(Settings(data_dir=tmp_path, node_name="hostb", cpu_workers=2), gpus=[])
    assert [s.name for s in specs] == ["coordinator@hostb", "coordinator2@hostb", "cpu0@hostb", "cpu1@hostb"]
    one = worker_specs(Settings(data_dir=tmp_path, node_name="hostb", coordinators=1), gpus=[], gpu_workers=False)
    assert [s.name for s in one] == ["coordinator@hostb"]
