"""Local-service discovery: `strata serve` records its URL and token file; the CLI and the lab read them back."""

from __future__ import annotations

from pathlib import Path

import pytest

from services import local_service as ls


def test_remembered_service_is_found_and_a_missing_or_bad_record_is_empty(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "cfg" / "local-service.json"
    monkeypatch.setattr(ls, "LOCAL_SERVICE_FILE", record)
    assert ls.local_service() == {}
    token = tmp_path / "local-token"
    token.write_text("t\n")
    ls.remember_local_service("http://127.0.0.1:8000", token)
    assert ls.local_service() == {"api_url": "http://127.0.0.1:8000", "token_file": str(token.resolve())}
    record.write_text("not json")
    assert ls.local_service() == {}
