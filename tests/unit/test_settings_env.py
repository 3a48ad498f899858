"""Every setting can be given as the text an environment variable holds (STRATA_<NAME>)."""

from __future__ import annotations

import json

import pytest
from pydantic import AliasChoices

from services.config import Settings


def _env_names(name: str) -> list[str]:
    alias = Settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [str(alias)] if alias else [f"STRATA_{name.upper()}"]


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


@pytest.mark.parametrize("name", sorted(n for n, f in Settings.model_fields.items() if f.default is not None))
def test_each_default_reads_back_from_its_environment_variable(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    default = Settings.model_fields[name].default
    monkeypatch.setenv(_env_names(name)[0], _as_text(default))
    assert getattr(Settings(), name) == default


@pytest.mark.parametrize(("env", "value"), [("STRATA_CLEAN_ORIENTATIONS", 1), ("STRATA_CLEAN_ORIENTATIONS", 4),
                                            ("STRATA_MAX_ORIENTATIONS", 8)])
def test_the_orientation_counts_take_environment_text(env: str, value: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env, str(value))
    assert getattr(Settings(), env.removeprefix("STRATA_").lower()) == value


def test_an_orientation_count_outside_its_choices_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_CLEAN_ORIENTATIONS", "3")
    with pytest.raises(ValueError, match="1, 2 or 4"):
        Settings()


def test_the_cli_names_a_bad_setting_and_exits_2_without_a_traceback() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "STRATA_CLEAN_ORIENTATIONS": "3", "STRATA_GPU_WORKER_THREADS": "many"}
    done = subprocess.run([sys.executable, "-m", "cli.main", "--version"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "invalid setting STRATA_CLEAN_ORIENTATIONS=3: Input should be 1, 2 or 4" in done.stderr
    assert "invalid setting STRATA_GPU_WORKER_THREADS=many" in done.stderr
    assert "Traceback" not in done.stderr
