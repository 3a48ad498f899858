"""One settings object for the whole service, read from ``STRATA_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of Strata. Defaults give the embedded single-machine setup."""

    model_config = SettingsConfigDict(env_prefix="STRATA_", env_file=None, extra="ignore")

    data_dir: Path = Field(default=Path("var"), description="Root for the SQLite file, storage and tokens.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite in data_dir.")
    redis_url: str | None = Field(default=None, description="Broker URL; unset = `strata serve` starts one.")
    storage_dir: Path | None = Field(default=None, description="Local storage root; default data_dir/storage.")

    # Uploads
    max_upload_mb: int = Field(default=2048, description="Per-file upload limit in MiB.")
    max_frames: int = 16

    # Decode sandbox
    decode_timeout_s: float = 300.0
    decode_memory_mb: int = 8192
    decode_workers: int = Field(
        default=0, description="Frames decoded at once (one LibRaw child each); 0 = one per frame up to the cores."
    )

    # Queue
    visibility_timeout_s: int = Field(default=600, description="Unacked task redelivery after a worker dies.")
    shard_max_retries: int = 3
    reconcile_interval_s: float = Field(default=15.0, description="Coordinator's lost-work sweep; 0 = off.")
    worker_heartbeat_s: float = 5.0
    gpu_ids: str | None = Field(
        default=None,
        validation_alias=AliasChoices("STRATA_GPU_ID", "STRATA_GPU_IDS"),
        description="Comma list of GPU ids to use (STRATA_GPU_ID=0,1); default all visible.",
    )
    cpu_workers: int = Field(default=1, description="GPU-queue workers to start when no GPU is present.")
    coordinator_concurrency: int = 2
    torch_threads: int = Field(default=0, description="Torch CPU threads per worker; 0 = cores / workers.")
    # Set by the launcher for each worker process it starts.
    worker_kind: str = Field(default="gpu", description="gpu | coordinator (set by the launcher).")
    worker_gpu: str = Field(default="cpu", description="GPU id this worker is pinned to, or 'cpu'.")

    # Planning
    strip_rows: int = Field(default=1288, description="Target rows per strip (IQ3_S); rounded to even.")
    strips_per_worker: int = Field(default=2, description="Strips per live GPU worker when the frame is big.")
    split_ratio: str | None = Field(default=None, description="Relative GPU shares, e.g. '0.6,0.4'.")

    # Models (enhancement packages, *.strata): a path or the name of a shipped package
    model_iq3_s: str | None = Field(
        default=None, description="Package for IQ3_S; unset = the shipped learned one, else classical."
    )
    model_iq2_xs: str | None = Field(default=None, description="Package for IQ2_XS (STRATA_MODEL_IQ2_XS).")
    model_tf32: bool = Field(default=True, description="TF32 tensor cores for model convolutions on GPUs.")
    model_precision: str | None = Field(
        default=None, description="float32 | bfloat16 | float16; default: the package's dtype on GPU, float32 on CPU."
    )

    # Export
    tiff_threads: int = Field(default=0, description="TIFF encode threads; 0 = all cores.")

    # Failure drills: an artificial pause inside every shard, so a worker can be killed mid-shard.
    fault_shard_delay_s: float = 0.0

    log_level: str = "INFO"
    log_format: str = Field(default="text", description="text | json (one JSON object a line, with job/shard ids).")
    metrics_dir: Path | None = Field(
        default=None, description="Prometheus multiprocess folder shared by every process; default data_dir/metrics."
    )
    migrate_on_start: bool = Field(default=True, description="The API upgrades the database when it starts.")
    token: str | None = Field(default=None, description="Bearer token `strata submit` uses (else the local one).")
    api_url: str = Field(default="http://127.0.0.1:8000", description="Where `strata submit` finds the API.")

    @property
    def resolved_metrics_dir(self) -> Path:
        return (self.metrics_dir or self.data_dir / "metrics").resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'strata.db').resolve()}"

    @property
    def resolved_storage_dir(self) -> Path:
        return (self.storage_dir or self.data_dir / "storage").resolve()

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 1024 * 1024

    @property
    def token_file(self) -> Path:
        return self.data_dir / "local-token"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, created once."""
    return Settings()
