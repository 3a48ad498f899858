"""A GPU worker's express lane: a consumer thread of its own for interactive shots' shards.

Celery's thread pool hands any message to any free thread. Under a batch every thread of a GPU worker holds a batch
strip (on the device, waiting for a slot, or storing its results), so an interactive shard waited in the queue until
one finished: 0.29 s on an H100 under a 100-shot batch (docs/PERFORMANCE.md). The express lane is a kombu consumer on
the interactive GPU queue (:data:`workers.queues.INTERACTIVE_GPU_QUEUE`) beside Celery's pool, taking one message at
a time; with the device slot kept for interactive shards (``services.pipeline.gate``) the shard starts at once.
Celery's pool consumes that queue too, ahead of the batch queue, so an idle worker spreads an interactive shot's
strips over all its threads and a worker without the lane (a CPU worker, ``STRATA_GPU_EXPRESS_LANE=0``) still runs
them.

Messages are Celery's own (protocol 2, sent by ``run_shard.apply_async``) and acknowledged after the handler
returns, as Celery does with ``task_acks_late``: a message of a worker lost mid-shard is delivered again after the
visibility timeout (the reconciler re-dispatches the shard sooner, from the worker's lapsed lease). A handler that
wants the work retried sends a new message itself and returns; so does one given a message whose ETA is still
ahead (a retry's countdown): the lane never holds a message, it sends it on to the shared GPU queue, whose Celery
consumers keep it until it is due.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu import Consumer, Message, Queue

log = logging.getLogger(__name__)

# (task name, args, kwargs, retries so far, seconds until its ETA or 0) -> None; raising logs the error and drops
# the message. A message with an ETA ahead (a retry's countdown) must not run yet: the handler sends it on to a queue
# whose Celery consumers hold it until then (the lane takes one message at a time and never holds one).
Handler = Callable[[str, list[Any], dict[str, Any], int, float], None]


def seconds_until(eta: object) -> float:
    """Seconds from now to a Celery ETA header (ISO 8601; None or unreadable: 0)."""
    if not isinstance(eta, str):
        return 0.0
    try:
        when = dt.datetime.fromisoformat(eta)
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


class ExpressLane:
    """One thread consuming ``queue`` and running each message through ``handler``, one at a time."""

    def __init__(self, app: Celery, queue: str, handler: Handler, poll_s: float = 1.0) -> None:
        self.app = app
        self.queue = queue
        self.handler = handler
        self.poll_s = poll_s
        self.handled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="strata-express", daemon=True)
        self._thread.start()
        log.info("express lane consuming %s", self.queue)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking messages; wait up to ``timeout`` s for the one in hand (a message left unacknowledged
        is delivered again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except Exception:  # noqa: BLE001 - the broker went away: connect again shortly
                log.warning("express lane: broker connection lost; reconnecting", exc_info=True)
                self._stop.wait(2.0)

    def _consume(self) -> None:
        with self.app.connection_for_read() as conn:
            queue = Queue(self.queue, routing_key=self.queue)
            with Consumer(conn, queues=[queue], callbacks=[self._on_message], prefetch_count=1,
                          accept=["json"]):
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=self.poll_s)
                    except TimeoutError:
                        continue
                    except socket.timeout:  # noqa: UP041 - kombu raises either, by transport
                        continue

    def _on_message(self, body: Any, message: Message) -> None:
        headers = message.headers or {}
        task = str(headers.get("task", ""))
        try:
            args, kwargs = list(body[0]), dict(body[1])
            self.handler(task, args, kwargs, int(headers.get("retries") or 0), seconds_until(headers.get("eta")))
        except Exception:  # noqa: BLE001 - one bad message never stops the lane
            log.exception("express lane: %s %s failed", task, headers.get("id"))
        finally:
            self.handled += 1
            message.ack()
