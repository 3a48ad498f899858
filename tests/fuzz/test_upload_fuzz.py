"""Upload fuzzing: mutants of a valid DNG (lab.fuzz.mutate) uploaded through the real API and ingested through
the real decoder sandbox (the fast DNG path and the LibRaw child): never a 5xx at upload, never an exception out
of the ingest (a worker would die), never a hang; each job refused (422), failed with a reason, or decoded.

CI: STRATA_FUZZ_MUTANTS mutants (30 by default); the long run (docs/OPERATIONS.md): STRATA_FUZZ_MUTANTS=2000.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lab.fuzz.mutate import mutants
from services.config import get_settings
from services.db.models import Job
from services.db.session import session_scope
from services.jobs import flow
from services.stations import create_station_token
from services.storage import get_storage
from tests.conftest import configure, reset_database

pytestmark = pytest.mark.fuzz
N = int(os.environ.get("STRATA_FUZZ_MUTANTS", "30"))


@pytest.fixture
def client(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The app on its own SQLite database (one backend is enough for the decoder)."""
    from api.app import create_app
    from services.db.session import reset_engine

    url = f"sqlite:///{tmp_path / 'strata.db'}"
    configure(url, tmp_path / "var")
    reset_database(url)
    monkeypatch.setenv("STRATA_DECODE_TIMEOUT_S", "30")
    get_settings.cache_clear()
    with TestClient(create_app(), raise_server_exceptions=False) as c:  # a 500 is a finding, listed
        yield c
    reset_engine()


def _ingest(job_id: str) -> str:
    """Ingest the job through the real decoder; its outcome (``failed`` needs a reason, else phase 0 planned)."""
    with session_scope() as session:
        flow.ingest_job(session, get_storage(), get_settings(), job_id, n_workers=1)
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job is not None
        if job.status == "failed":
            assert job.error and job.error.startswith("decode failed: "), job.error
        else:
            assert job.status == "running" and job.phase == 0, (job.status, job.stage)
        return f"ingest {job.status}"


def test_mutated_dngs_never_break_upload_or_ingest(client: TestClient, synth_dir: Path) -> None:
    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'fuzz')}"}
    seed = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    outcomes: collections.Counter[str] = collections.Counter()
    findings: list[str] = []
    for i, mutant in enumerate(mutants(seed, N, seed=int(os.environ.get("STRATA_FUZZ_SEED", "0")))):
        r = client.post("/v1/jobs", headers=auth, files=[("frames", (f"m{i}.dng", mutant.data))],
                        data={"priority": "batch", "camera": "IQ3_S"})  # batch: no message; ingested below
        if r.status_code >= 500 or (r.status_code != 202 and set(r.json()) != {"type", "detail"}):
            findings.append(f"mutant {i} ({mutant.kind}): upload answered {r.status_code} {r.text[:200]}")
            continue
        if r.status_code != 202:
            outcomes[f"refused {r.status_code}"] += 1
            continue
        try:
            outcomes[_ingest(r.json()["id"])] += 1
        except Exception as exc:  # noqa: BLE001 - every finding is listed, not only the first
            findings.append(f"mutant {i} ({mutant.kind}): ingest raised {type(exc).__name__}: {exc}")
    print(f"\nupload fuzzing: {N} mutants: {dict(outcomes)}; findings: {len(findings)}")
    assert not findings, "\n".join(findings)
