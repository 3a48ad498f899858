"""The REST API (FastAPI). The settings are checked before anything reads them (services.metrics does on import):
a bad STRATA_* variable prints one line each and exits 2, under `uvicorn api.app:create_app` as under `strata`."""

from services.config import settings_or_exit

settings_or_exit()
