"""A broker that accepts connections but never answers (a frozen Redis, a black-holed network): found from
outside, an upload then got no answer at all, its publish waiting forever. Publishes now give up after
STRATA_BROKER_TIMEOUT_S and count as the broker being down (the upload's job is left to the outbox)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from services.config import Settings
from workers.app import make_celery


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A TCP listener on loopback that accepts and reads, and never writes a byte back."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


def test_a_publish_to_a_broker_that_hangs_gives_up(silent_broker: str) -> None:
    from workers.tasks import BROKER_DOWN

    app = make_celery(Settings(redis_url=silent_broker, broker_timeout_s=1))
    outcome: list[BaseException | None] = []

    def publish() -> None:
        try:
            app.send_task("strata.ingest", ("job",), queue="coordinator", retry=False)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what it raised is the point
            outcome.append(exc)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    thread.join(60)  # a hang guard, not a timing: the publish used to wait forever
    assert not thread.is_alive(), "the publish still waits on a broker that never answers"
    assert outcome and isinstance(outcome[0], BROKER_DOWN), outcome
