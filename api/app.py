"""The FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from api.deps import refuse_token_in_query
from api.errors import install_error_handlers
from api.limits import HeaderLimits
from api.routes import batches, dashboard, health, jobs, metrics, recipes, tokens, workers
from api.schemas import ErrorOut
from services.config import get_settings, settings_or_exit, unknown_variables
from services.errors import StorageUnavailable
from services.export.recipes import read_at_start as read_recipes_at_start
from services.logs import configure_logging
from services.storage import get_storage


@asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    for line in unknown_variables():
        logging.getLogger(__name__).warning("%s", line)
    read_recipes_at_start()
    try:  # said once at start; /readyz keeps saying it while it lasts
        get_storage().check()
    except StorageUnavailable as exc:
        logging.getLogger(__name__).error("%s (/readyz reports it until it is fixed)", exc.detail)
    if settings.migrate_on_start:
        from services.db.migrate import upgrade

        upgrade()
    yield


def create_app() -> FastAPI:
    settings = settings_or_exit()
    # Here as well as at start-up: a server that calls this factory logs its own start ("Started server process")
    # before the lifespan runs (found from outside: those lines stayed plain text with STRATA_LOG_FORMAT=json).
    configure_logging(settings.log_level, settings.log_format)
    app = FastAPI(
        title="Strata",
        version="1.0",
        summary="Asynchronous RAW render service: upload shots, poll jobs, download 16-bit TIFFs.",
        lifespan=_lifespan,
        dependencies=[Depends(refuse_token_in_query)],
        # Any route may refuse a malformed request (400), a chunked or over-1-MiB body other than an upload (411,
        # 413), a client in failed-auth back-off (429) or oversized headers (431), always with the {"type", "detail"}
        # shape.
        responses={code: {"model": ErrorOut} for code in (400, 411, 413, 429, 431)},
    )
    install_error_handlers(app)
    app.add_middleware(HeaderLimits)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(recipes.router)
    app.include_router(tokens.router)
    app.include_router(tokens.me_router)
    app.include_router(workers.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    return app
