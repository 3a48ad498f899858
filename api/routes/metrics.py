"""Prometheus /metrics: every process's counters and histograms (multiprocess files) plus gauges read now from
the database and Redis."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from services import metrics
from services.config import get_settings
from services.db.session import session_scope
from services.jobs import stats
from workers.app import COORDINATOR_QUEUES, GPU_QUEUES, PRIORITIES, broker_url
from workers.registry import live_workers, queue_depths_by_priority, redis_client

router = APIRouter(tags=["metrics"])


class ScrapeTimeCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("strata_jobs", "Jobs by status (database).", labels=["status"])
        failures = GaugeMetricFamily("strata_decode_failed_jobs", "Jobs failed at decode (database).")
        with session_scope() as session:
            for status, n in stats.jobs_by_status(session).items():
                jobs.add_metric([status], n)
            failures.add_metric([], stats.decode_failures(session))
        yield jobs
        yield failures
        queues = GaugeMetricFamily("strata_queue_depth", "Messages waiting (Redis).", labels=["queue", "priority"])
        workers = GaugeMetricFamily("strata_workers", "Live workers (heartbeats).", labels=["kind", "busy"])
        client = redis_client(broker_url(get_settings()))
        depths = queue_depths_by_priority(client, [*COORDINATOR_QUEUES, *GPU_QUEUES], PRIORITIES)
        for queue, by_priority in depths.items():
            for priority, n in by_priority.items():
                queues.add_metric([queue, priority], n)
        counts: dict[tuple[str, str], int] = {}
        for w in live_workers(client):
            counts[(w.kind, str(w.busy).lower())] = counts.get((w.kind, str(w.busy).lower()), 0) + 1
        for (kind, busy), n in counts.items():
            workers.add_metric([kind, busy], n)
        yield queues
        yield workers


def _render() -> bytes:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=metrics.MULTIPROC_DIR)
    registry.register(ScrapeTimeCollector())
    return generate_latest(registry)


@router.get("/metrics", response_class=Response, include_in_schema=False)
async def prometheus_metrics() -> Response:
    return Response(await run_in_threadpool(_render), media_type=CONTENT_TYPE_LATEST)
