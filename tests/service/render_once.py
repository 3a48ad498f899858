"""One full in-process render of a shot in a fresh process (``python -m tests.service.render_once DIR DNG``):
prints the sha256 of every output as JSON. tests/service/test_deterministic_bytes.py runs it twice."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

RECIPES = ("tiff16", "tiff16-zstd", "tiff16-adobergb", "tiff16-prophoto", "tiff8", "jpeg", "jpeg-proof", "png16")
JOB_ID = "0" * 31 + "1"  # the same id in both runs (outputs may carry it)


def main(root: Path, dng: Path) -> dict[str, str]:
    os.environ["STRATA_LOG_LEVEL"] = "WARNING"
    from tests.conftest import configure, reset_database

    url = f"sqlite:///{root / 'strata.db'}"
    configure(url, root / "var")
    reset_database(url)
    from services.db.models import Output, Station
    from services.db.session import session_scope
    from services.jobs.service import ReceivedFile, create_job
    from services.storage import get_storage
    from tests.service.test_flow import _run_to_the_end

    data = dng.read_bytes()
    key = f"jobs/{JOB_ID}/frames/00_{dng.name}"
    with get_storage().writer(key) as f:
        f.write(data)
    with session_scope() as session:
        station = Station(name="studio", token_hash="x" * 64)
        session.add(station)
        session.flush()
        create_job(session, station, JOB_ID, [ReceivedFile(dng.name, key, hashlib.sha256(data).hexdigest(),
                                                           len(data), "IQ3_S")],
                   camera="IQ3_S", recipe=None, priority=None, sha256=[], recipes=RECIPES)
    _run_to_the_end(JOB_ID)
    with session_scope() as session:
        outs = session.query(Output).filter(Output.job_id == JOB_ID).all()
        return {o.name: hashlib.sha256(get_storage().open(o.storage_key).read()).hexdigest() for o in outs}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), sort_keys=True))
