"""The FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.errors import install_error_handlers
from api.routes import batches, health, jobs, recipes
from services.config import get_settings


@asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.migrate_on_start:
        from services.db.migrate import upgrade

        upgrade()
    yield


def create_app() -> FastAPI:
    app = FastAPI(
        title="Strata",
        version="1.0",
        summary="Asynchronous RAW render service: upload shots, poll jobs, download 16-bit TIFFs.",
        lifespan=_lifespan,
    )
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(recipes.router)
    return app
