"""Schema fuzzing: schemathesis generates requests for every operation of ``/openapi.json`` and sends them to the
real app (in process, ASGI) on a real database and Redis, authenticated with an admin token (which every route
accepts, admin routes included): no 5xx, status codes, content types, headers and bodies as documented.

CI: ``pytest -m fuzz tests/fuzz`` (STRATA_FUZZ_EXAMPLES examples per operation, 8 by default). The long run
(docs/OPERATIONS.md): STRATA_FUZZ_EXAMPLES=250.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from api.app import create_app
from tests.conftest import configure, reset_database, restore_environment

pytestmark = pytest.mark.fuzz
EXAMPLES = int(os.environ.get("STRATA_FUZZ_EXAMPLES", "8"))


APP = create_app()  # no database access until a request comes


@pytest.fixture(scope="module")
def token() -> Iterator[str]:
    """An admin token on a fresh SQLite database of the fuzz run's own; the environment restored after."""
    from services.db.session import reset_engine, session_scope
    from services.stations import create_station_token

    saved = dict(os.environ)
    os.environ["STRATA_AUTH_FAILURES"] = "0"  # the fuzzer sends wrong tokens on purpose: no back-off here
    root = Path(tempfile.mkdtemp(prefix="strata-fuzz-"))
    url = f"sqlite:///{root / 'strata.db'}"
    configure(url, root / "var")
    reset_database(url)
    with session_scope() as session:
        yield create_station_token(session, "fuzz-admin", role="admin")
    reset_engine()
    restore_environment(saved)


schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
# /readyz answers a documented 503 while no worker runs (none do here): that is its answer, not a failure.
DOCUMENTED_503 = {("GET", "/readyz")}


def _no_5xx(case: schemathesis.Case, response: schemathesis.Response) -> None:
    if response.status_code == 503 and (case.method.upper(), case.path) in DOCUMENTED_503:
        return
    assert response.status_code < 500, (f"{case.method} {case.formatted_path}: {response.status_code} "
                                        f"{response.text[:300]}")


CHECKS = [checks.status_code_conformance, checks.content_type_conformance,
          checks.response_headers_conformance, checks.response_schema_conformance]


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_and_never_5xx(case: schemathesis.Case, token: str) -> None:
    response = case.call(headers={"Authorization": f"Bearer {token}"})  # over any generated Authorization
    if case.path == "/v1/tokens/me":
        assert response.status_code == 200, response.text  # the token is really the one sent
    _no_5xx(case, response)
    case.validate_response(response, checks=CHECKS)
