"""Local-service discovery: each `strata serve` records its URL and token file in its data directory; the CLI
and the lab read the record of the data directory they are given, else of ./var, else the last one started."""

from __future__ import annotations

from pathlib import Path

import pytest

from services import local_service as ls


def test_each_data_dir_has_its_own_record_and_the_last_one_is_the_fallback(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ls, "LAST_SERVICE_FILE", tmp_path / "cfg" / "local-service.json")
    monkeypatch.chdir(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    assert ls.local_service() == {} and ls.local_service(a) == {}
    for d, port in ((a, 8001), (b, 8002)):
        d.mkdir()
        (d / "local-token").write_text("t\n")
        ls.remember_local_service(f"http://127.0.0.1:{port}", d / "local-token", d)
    assert ls.local_service(a)["api_url"] == "http://127.0.0.1:8001"  # b started later: a's record stands
    assert ls.local_service(b)["token_file"] == str((b / "local-token").resolve())
    assert ls.local_service()["api_url"] == "http://127.0.0.1:8002"  # no data dir, no ./var: the last started
    ls.remember_local_service("http://127.0.0.1:8003", a / "local-token", tmp_path / "var")
    assert ls.local_service()["api_url"] == "http://127.0.0.1:8003"  # ./var of the current folder
    ls.service_file(a).write_text("not json")
    assert ls.local_service(a) == {}
