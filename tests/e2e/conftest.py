"""The real service stack of the e2e modules that only use it (test_end_to_end, test_station_cli,
test_bench_service): uvicorn API, real Redis, real Celery worker processes (three coordinators and two GPU-queue
workers on the CPU), one per database backend, started once for all of those modules instead of once per module.

Each module still gets a station of its own (its own token, so its job lists hold only its jobs) and the stack's
environment for its duration; a worker that a test kills is restarted as `strata serve` restarts it, and a module
starts only once both GPU-queue workers answer again. The modules' tests run grouped by backend (at the place of the
first of them), so one stack runs at a time, and each stack stops after the last test that uses it."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import BACKENDS, backend_url, configure, reset_database, restore_environment
from tests.e2e.supervised import wait_ready

SHARD_DELAY_S = 0.4  # failure drill: every shard pauses, so a worker can be killed mid-shard
VISIBILITY_S = 6  # an unacknowledged shard of a killed worker is redelivered after this
_LAST_USER: dict[str, str] = {}  # backend -> node id of the last test using its stack (stopped after it)


@dataclass
class Stack:
    url: str
    headers: dict[str, str]
    supervisor: object
    redis_url: str
    env: dict[str, str]


@dataclass
class _Running:
    """One backend's started stack: its supervisor, polled (dead children restarted) until stopped."""

    url: str
    db_url: str
    root: Path
    supervisor: object
    redis_url: str
    env: dict[str, str]
    stop_polling: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self.stop_polling.set()
        self.supervisor.stop(timeout=10)  # type: ignore[attr-defined]


class StackPool:
    """The started stacks by backend: at most one runs (starting one stops the other)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.redis_url = redis_url
        self.running: dict[str, _Running] = {}

    def get(self, backend: str) -> _Running:
        for other in [b for b in self.running if b != backend]:
            self.stop(other)
        if backend not in self.running:
            self.running[backend] = _start_stack(backend, self.tmp_path_factory.mktemp(f"e2e-{backend}"),
                                                 self.redis_url)
        return self.running[backend]

    def stop(self, backend: str) -> None:
        if (running := self.running.pop(backend, None)) is not None:
            running.stop()

    def stop_all(self) -> None:
        for backend in list(self.running):
            self.stop(backend)


_POOL: StackPool | None = None


def _stack_env(backend: str, db_url: str, root: Path, redis_url: str) -> dict[str, str]:
    return {"STRATA_DATABASE_URL": db_url, "STRATA_DATA_DIR": str(root / "var"), "STRATA_REDIS_URL": redis_url,
            "STRATA_CPU_WORKERS": "2", "STRATA_TORCH_THREADS": "1", "STRATA_FAULT_SHARD_DELAY_S": str(SHARD_DELAY_S),
            "STRATA_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S), "STRATA_WORKER_HEARTBEAT_S": "1",
            "STRATA_MIGRATE_ON_START": "false", "STRATA_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1",
            # a GPU worker's express lane (on by default on GPUs only): exercised on the CPU with one backend
            "STRATA_GPU_EXPRESS_LANE": "1" if backend == BACKENDS[-1] else "0"}


def _start_stack(backend: str, root: Path, redis_url: str) -> _Running:
    import redis

    from services.config import get_settings
    from workers.launcher import ProcSpec, Supervisor, free_port, lease_releaser, worker_specs

    db_url = backend_url(backend, root)
    # A Redis database of our own, emptied, so no stale message reaches these workers.
    base, _, db_number = redis_url.rpartition("/")
    e2e_redis = f"{base}/{int(db_number or 0) + 1}"  # the next database: parallel runs on other bases stay apart
    redis.Redis.from_url(e2e_redis).flushdb()
    env = _stack_env(backend, db_url, root, e2e_redis)
    configure(db_url, root / "var")
    reset_database(db_url)
    saved_env = dict(os.environ)
    os.environ.update(env)
    get_settings.cache_clear()
    try:
        port = free_port()
        specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                                  "127.0.0.1", "--port", str(port), "--log-level", "warning"])]
        specs += worker_specs(get_settings())
        # the whole environment of now: a child restarted later does not see a later module's variables
        sup = Supervisor(specs, env=dict(os.environ), log_dir=root / "logs", on_exit=lease_releaser(get_settings()))
    finally:
        restore_environment(saved_env)
    sup.start()
    running = _Running(f"http://127.0.0.1:{port}", db_url, root, sup, e2e_redis, env)

    def supervise() -> None:  # what `strata serve` does: notice dead children (a test kills one), restart them
        while not running.stop_polling.wait(0.5):
            sup.poll()

    threading.Thread(target=supervise, daemon=True).start()
    return running


def _wait_ready(running: _Running) -> None:
    """Until /readyz answers 200 with both GPU-queue workers (after a restart: once the new one beats)."""
    ready = wait_ready(running.url, lambda workers: workers.get("gpu", 0) >= 2)
    if ready is not None:
        logs = "\n".join(p.read_text()[-2000:] for p in (running.root / "logs").glob("*.log"))
        pytest.fail(f"service did not become ready: {ready}\n{logs}")


@pytest.fixture(scope="session")
def stack_pool(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[StackPool]:
    global _POOL
    _POOL = StackPool(tmp_path_factory, redis_url)
    try:
        yield _POOL
    finally:
        _POOL.stop_all()
        _POOL = None


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest, stack_pool: StackPool) -> Iterator[Stack]:
    """The backend's shared stack, with a station of this module's own and the stack's environment set."""
    from services.config import get_settings
    from services.db.session import session_scope
    from services.stations import create_station_token

    running = stack_pool.get(request.param)
    configure(running.db_url, running.root / "var")
    with session_scope() as session:
        token = create_station_token(session, f"e2e-{request.module.__name__.rsplit('.', 1)[-1]}")
    saved_env = dict(os.environ)
    os.environ.update(running.env)
    get_settings.cache_clear()
    try:
        _wait_ready(running)
        yield Stack(running.url, {"Authorization": f"Bearer {token}"}, running.supervisor, running.redis_url,
                    running.env)
    finally:
        restore_environment(saved_env)


def _stack_backend(item: pytest.Item) -> str | None:
    """The backend of this directory's ``stack`` fixture that ``item`` uses, if it does."""
    spec = getattr(item, "callspec", None)
    here = Path(__file__).parent
    if spec is None or "stack" not in getattr(item, "fixturenames", ()) or here not in item.path.parents:
        return None
    backend = spec.params.get("stack")
    return backend if backend in BACKENDS else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared stack's tests grouped by backend (module order kept within each), where the first of them was:
    each backend's stack starts once. Records the last user of each."""
    users = [(item, b) for item in items if (b := _stack_backend(item)) is not None]
    _LAST_USER.clear()
    if not users:
        return
    first = items.index(users[0][0])
    grouped = [item for backend in BACKENDS for item, b in users if b == backend]
    chosen = {id(item) for item, _ in users}
    rest = [item for item in items if id(item) not in chosen]
    items[:] = rest[:first] + grouped + rest[first:]
    for item, backend in users:
        _LAST_USER[backend] = item.nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test that uses a backend's stack (its module's fixtures torn down): stop that stack."""
    try:
        return (yield)
    finally:
        backend = _stack_backend(item)
        if backend is not None and _LAST_USER.get(backend) == item.nodeid and _POOL is not None:
            _POOL.stop(backend)
