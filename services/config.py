"""One settings object for the whole service, read from ``STRATA_*`` environment variables."""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _whole(value: object) -> object:
    """An environment variable's text as a whole number, for the settings that take one of a few numbers (an int
    ``Literal`` does not take the text "2" of ``STRATA_CLEAN_ORIENTATIONS=2`` as 2); anything else as it is."""
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    return value


class Settings(BaseSettings):
    """Every knob of Strata. Defaults give the embedded single-machine setup."""

    model_config = SettingsConfigDict(env_prefix="STRATA_", env_file=None, extra="ignore")

    data_dir: Path = Field(default=Path("var"), description="Root for the SQLite file, storage and tokens.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite in data_dir.")
    worker_commits: Literal["async", "durable"] = Field(
        default="async", description="The Celery workers' database commits: async (SQLite synchronous=NORMAL in "
        "WAL mode, PostgreSQL synchronous_commit=off: a commit does not wait for the disk; a power cut, or a "
        "PostgreSQL server crash, can lose a worker's last commits, never corrupt the database, and the "
        "reconciler redoes those steps) or durable. The API's commits (uploads, batches, tokens, removals) always "
        "wait for the disk.")
    db_busy_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="SQLite: how long a write waits for another process's lock before "
        "it fails (the API then answers 503 database_unavailable).")
    redis_url: str | None = Field(default=None, description="Broker URL; unset = `strata serve` starts one.")
    broker_timeout_s: float = Field(
        default=5.0, gt=0, le=120, description="Seconds a broker command (a publish, a connect) may take before it "
        "counts as the broker being down: an upload whose ingest cannot be sent is answered 202 and left to the "
        "outbox instead of waiting on a broker that hangs.")
    storage_dir: Path | None = Field(default=None, description="Local storage root; default data_dir/storage.")
    storage_url: str | None = Field(
        default=None,
        description="s3://bucket/prefix = S3-compatible object storage (endpoint, region and credentials from "
        "boto3's AWS_* variables and ~/.aws); file:///path or unset = local files (storage_dir).",
    )
    scratch_dir: Path | None = Field(default=None, description="Object storage's local scratch cache; default "
                                     "data_dir/scratch.")
    scratch_mb: int = Field(default=20480, description="Scratch cache size cap in MiB (LRU eviction).")
    early_sync_s: float = Field(default=0.1, ge=0, description="Local storage: a durable write (uploads, outputs) "
                                "hands what it has written to the disk this often (fdatasync), so its closing "
                                "fsync waits only for the tail; 0: the closing fsync alone.")
    s3_part_mb: int = Field(default=16, description="Multipart upload part size in MiB.")
    s3_downloads: Literal["stream", "redirect"] = Field(
        default="stream", description="Output downloads with S3: stream | redirect (307 to a pre-signed URL).")
    s3_create_bucket: bool = Field(
        default=False, description="Create the bucket of STRATA_STORAGE_URL where it does not exist (MinIO in "
        "docker-compose, tests); off, a missing bucket is an error (a typo is not silently a new, empty bucket).")
    s3_presign_s: int = Field(default=900, description="Lifetime of a pre-signed download URL.")
    s3_public_endpoint: str = Field(
        default="", description="The object store's address as stations reach it (redirect downloads are signed for "
        "it, e.g. http://hosta:9000 where the service reaches MinIO as http://minio:9000); empty: the service's own.")
    node_name: str | None = Field(default=None, description="This host's name in worker names; default hostname.")

    # Retention
    retention_days: float = Field(default=30, description="Uploads and outputs kept this long after their job "
                                  "ended; 0 = forever.")
    retention_interval_s: float = Field(default=3600, description="Coordinator's retention pass; 0 = off.")

    # Uploads
    max_upload_mb: int = Field(default=2048, description="Per-file upload limit in MiB.")
    max_frames: int = 16
    max_form_fields: int = Field(default=100, description="Non-file fields of one upload form at most.")
    idempotency_hours: float = Field(default=24, description="How long an Idempotency-Key is remembered.")
    outbox_grace_s: float = Field(default=2.0, description="An admitted job whose ingest message is not sent "
                                  "this long after admission is sent by the coordinator's outbox pass.")
    auth_failures: int = Field(default=10, description="Wrong tokens in a row from one address before 429.")
    auth_backoff_s: float = Field(default=1.0, description="First failed-auth back-off; doubles per further "
                                  "failure, up to auth_backoff_max_s.")
    auth_backoff_max_s: float = 300.0

    # Decode sandbox
    decode_timeout_s: float = 300.0
    decode_memory_mb: int = 8192
    decode_fast_dng: bool = Field(
        default=True, description="Read uncompressed Bayer DNGs straight from the file (no LibRaw; same result)."
    )
    decode_workers: int = Field(
        default=0, description="Frames decoded at once (one LibRaw child each); 0 = one per frame up to the cores."
    )

    # Queue
    visibility_timeout_s: int = Field(default=600, description="Unacked task redelivery after a worker dies.")
    shard_max_retries: int = 3
    reconcile_interval_s: float = Field(default=3.0, description="Coordinator's lost-work sweep; 0 = off.")
    worker_heartbeat_s: float = Field(
        default=2.0, description="Heartbeat period; a worker is dead (its shard or job re-dispatched) after 3 missed."
    )
    worker_hung_after_s: float = Field(
        default=60.0, description="A supervised worker that is alive but has not beaten for this long (SIGSTOPped, "
        "stuck in a call that holds the interpreter) is SIGKILLed and restarted; at least 4 heartbeats; 0 = never.")
    lost_message_after_s: float = Field(
        default=30.0, description="A queued job whose ingest message no worker holds is re-sent after this long."
    )
    gpu_ids: str | None = Field(
        default=None,
        validation_alias=AliasChoices("STRATA_GPU_ID", "STRATA_GPU_IDS"),
        description="Comma list of GPU ids to use (STRATA_GPU_ID=0,1); default all visible.",
    )
    cpu_workers: int = Field(default=1, description="GPU-queue workers to start when no GPU is present.")
    workers_per_gpu: int = Field(
        default=1, ge=1, le=8, description="GPU-queue worker processes per GPU, each planning strips for its share "
        "of the GPU's memory. 2 was slower on one H200 (latency and batch, docs/PERFORMANCE.md), hence 1.")
    gpu_worker_threads: int = Field(
        default=2, ge=1, le=4, description="Device slots of a GPU worker process: shards on the device at once, each "
        "on its own CUDA stream (one model copy): one shard's downloads overlap another's model pass (a batch on one "
        "H200: 1.58 frames/s with 2, 1.17-1.19 with 1; on an H100 3 gave 2.29 against 3.09, every frame split in "
        "two strips). Each plans strips for its share of the GPU's memory. CPU workers compute one shard at a time.")
    gpu_urgent_slots: int | None = Field(
        default=None, ge=0, le=2, description="Device slots of a GPU worker kept for interactive shots' shards beyond "
        "STRATA_GPU_WORKER_THREADS (and a worker thread each): batch strips hold at most STRATA_GPU_WORKER_THREADS, "
        "so an interactive strip does not wait for a batch strip to leave the device (services/pipeline/gate.py). "
        "With the batch's pauses (STRATA_GPU_URGENT_YIELD_S), two A/Bs on one H100 in both orders: an interactive "
        "shot during a 100-shot batch 1.85 / 1.84 s against 2.08 / 2.16 s with 0, the batch no slower "
        "(docs/PERFORMANCE.md); 0: an interactive strip takes the next free slot first. Default: 1 on a host with "
        "one GPU worker (measured there), 0 with several (like STRATA_GPU_OVERLAP_THREADS: the extra thread would "
        "take batch shards from the shared queue that an idle GPU could run; not measured yet).")
    gpu_express_lane: bool | None = Field(
        default=None, description="A GPU worker's own consumer thread for interactive shots' shards (queue "
        "gpu.interactive, workers/express.py) beside its Celery threads, which a batch keeps busy: an interactive "
        "strip then waits for no batch strip to end before it starts. It stands in for the worker thread of "
        "STRATA_GPU_URGENT_SLOTS. Default: on for a worker on a GPU, off for CPU workers (one shard at a time).")
    gpu_urgent_yield_s: float = Field(
        default=2.0, ge=0, le=10, description="While an interactive shot's shard is on a GPU worker's device, its "
        "batch shards pause at their next yield point (between a self-ensemble's model passes, before their bins and "
        "tiles) for up to this many seconds each time, so the interactive strip has the device to itself "
        "(services/pipeline/gate.py); 0 = never. On one H200 an interactive shot during a 100-shot batch took 1.52 s "
        "instead of 2.03 (idle 1.0), the batch's rate unchanged (docs/PERFORMANCE.md).")
    gpu_overlap_threads: int | None = Field(
        default=None, ge=0, le=8, description="Threads a GPU worker runs beyond its STRATA_GPU_WORKER_THREADS device "
        "slots: a strip stores its results (tile streams, bins) after giving its slot back, so the next strip's model "
        "pass overlaps the store (services/pipeline/gate.py); 0 = a thread per slot. Default: 2 on a host with one "
        "GPU worker (measured there), 0 with several (a worker's extra threads would take shards from the shared "
        "queue that an idle GPU could run; not measured yet).")
    coordinators: int = Field(
        default=2, description="Coordinator processes a launcher starts (serve, coordinator); a survivor takes over "
        "the ingest or finalize of one that dies at once, without waiting for its restart.",
    )
    express_coordinators: int = Field(
        default=1, ge=0, le=4, description="Coordinator processes per coordinator host that take only interactive "
        "shots' steps (ingest, finalize), so one never waits behind a batch's finalizes; 0 = none.")
    coordinator_lane: str = Field(default="all", description="all | interactive (set by the launcher).")
    coordinator_concurrency: int = 3
    torch_threads: int = Field(default=0, description="Torch CPU threads per worker process; 0 = cores / CPU "
                               "workers, cores / coordinator slots for coordinators, torch's default on GPU workers.")
    # Set by the launcher for each worker process it starts.
    worker_kind: str = Field(default="gpu", description="gpu | coordinator (set by the launcher).")
    worker_gpu: str = Field(default="cpu", description="GPU id this worker is pinned to, or 'cpu'.")

    # Batches and admission (docs/BATCHES.md)
    timezone: str = Field(default="UTC", description="The studio's time zone (IANA name) for naive batch windows.")
    batch_window_missed: str = Field(
        default="wait", description="Shots not started by a batch's not_after: wait (same times next day) | skip."
    )
    import_root: Path | None = Field(default=None, description="Server-side folder batches may import paths from.")
    batch_in_flight: int = Field(
        default=0, description="Batch-lane jobs in flight at once; 0 = 2 per live GPU worker slot + live batch "
        "coordinator slots (at least GPU worker slots + 1).",
    )
    admission_interval_s: float = Field(default=1.0, description="Coordinator's admission pass; 0 = off.")
    webhook_max_attempts: int = Field(default=6, description="Batch webhook deliveries tried before giving up.")
    webhook_backoff_s: float = Field(default=2.0, description="First webhook retry delay; doubles each attempt.")
    webhook_timeout_s: float = 10.0
    webhook_allow_loopback: bool = Field(
        default=False, description="Batch webhooks may go to a loopback address (127.0.0.1: a receiver on the "
        "service's own host; tests). Off: a batch cannot make the server call its own services.")

    # Planning
    strip_rows: int = Field(
        default=0, description="Rows per strip; 0 = as many as fit the GPU workers' memory budget (1288 on CPUs)."
    )
    strips_per_worker: int = Field(default=1, description="Strips per live GPU worker (at least).")
    gpu_memory_fraction: float = Field(
        default=0.8, description="Share of a GPU's memory free after warm-up that strips may plan for."
    )
    split_ratio: str | None = Field(default=None, description="Relative GPU shares, e.g. '0.6,0.4'.")

    # Models (enhancement packages, *.strata): a path or the name of a shipped package
    model_iq3_s: str | None = Field(
        default=None, description="Package for IQ3_S; unset = the shipped learned one, else classical."
    )
    model_iq2_xs: str | None = Field(default=None, description="Package for IQ2_XS (STRATA_MODEL_IQ2_XS).")
    model_tier: Literal["best", "fast", "max"] = Field(
        default="best", description="Learned package when neither the camera's setting nor a recipe names one: best "
        "(strata_jdd_v2; a clean single frame averaged over two orientations), fast (strata_jdd_v1: 0.02 s less GPU "
        "per 80 MP frame, 0.3-0.7 dB lower PSNR) or max "
        "(strata_jdd_v2 averaged over 4 orientations on single frames: 4x its GPU time, about +0.9 dB without "
        "noise). A recipe's `model` overrides it per job.")
    max_orientations: Annotated[Literal[2, 4, 8], BeforeValidator(_whole)] = Field(
        default=4, description="Orientations the `max` tier averages on single frames: 4 (+0.88 dB over one pass "
        "without noise, +0.26-0.45 with it; about 4x its GPU time) or 2 (identity and a quarter turn: +0.57 / "
        "+0.25 dB without / at low noise for 2x, what `best` does on clean shots: docs/QUALITY.md) or 8.")
    clean_orientations: Annotated[Literal[1, 2, 4], BeforeValidator(_whole)] = Field(
        default=2, description="Orientations the `best` tier averages on a clean single frame (signal-to-noise at "
        "18 % grey >= 24 dB: base ISO to about ISO 1600): 2 (+0.57 dB without noise, +0.25 at low noise, 0.09 s "
        "more GPU per 80 MP frame; docs/QUALITY.md), 1 (off) or 4. Noisier shots render once.")
    stack_frames_package: str = Field(
        default="auto", description="The package a stack's frames' model pass uses: auto (the shot package's "
        "shipped companion: strata_jdd_v2_frames 2.2.0, trained on stacks, for strata_jdd_v2; +0.1..+0.5 dB over "
        "strata_jdd_v2 on the stack benchmark's photographs at mid noise; but the shot's package where the frames "
        "sample the scene at one place, a tripod, whole-pixel offsets or frames within about half a pixel of each "
        "other, where the companion's false colour on fine detail stays: stack.samples_in_one_place), same (the "
        "shot's package) or a package name or path. Chosen once per shot.")
    model_tf32: bool = Field(default=True, description="TF32 tensor cores for model convolutions on GPUs.")
    model_precision: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="The model pass's numerics: float32 | bfloat16 | float16; default float16 on GPUs "
        "(0.085 s per 80 MP frame with the folded network against 0.238 s in float32 + TF32, 13 LSB mean off it, "
        "quality within 0.01 dB, strips exact: docs/PERFORMANCE.md), float32 on the CPU.")
    resident_accumulators: Literal["auto", "on", "off"] = Field(
        default="auto", description="Keep a stack's frame-group accumulator on the device that merged it, for the "
        "strip that fuses it next on that device (one GPU): it skips reloading and uploading the stored file. auto: "
        "on GPUs; on: also on the CPU (tests); off: never.")
    group_store: Literal["background", "inline"] = Field(
        default="background", description="Where a kept frame-group accumulator (resident_accumulators) is written "
        "to storage: background: on a thread of the worker after the group's task has finished, so the strip that "
        "fuses it on the same device starts at once (a reader elsewhere waits for the file while a marker says it "
        "is on its way); inline: inside the group's task, as without resident accumulators.")
    merge_precision: Literal["float32", "bfloat16", "float16"] = Field(
        default="float16", description="The package pass over each frame of a stack's frame group on a GPU (whole "
        "frames, no strips to stitch; the same on every group, so the fusion stays exact): float16 took 0.064 s a "
        "50 MP frame against 0.071 s in bfloat16, stacks within 0.022 dB of it (docs/PERFORMANCE.md). The CPU "
        "computes as the strips (float32).")
    stack_warp: Literal["bicubic", "lanczos3", "lanczos4", "lanczos5"] = Field(
        default="lanczos5", description="How a stack frame's render is resampled onto the reference: lanczos5, "
        "lanczos4, lanczos3 (separable, 10 / 8 / 6 taps a pass; the more lobes, the more detail kept near the finest "
        "scale at sub-pixel shifts: anti-aliased photo stacks +0.19..+0.68 dB at 4 frames and +0.44..+1.43 at 8 "
        "with lanczos5 over bicubic, docs/QUALITY.md) or bicubic. On a GPU the Lanczos passes are fused Triton "
        "kernels: 8 ms a 50 MP frame for lanczos5 on an H100, bicubic 7 ms (docs/PERFORMANCE.md); the CPU runs them "
        "as torch operations, about 4x bicubic's time. Set it alike on every host: a shot's frame groups must warp "
        "alike.")

    # Export
    tiff_threads: int = Field(default=0, description="TIFF encode threads; 0 = all cores.")
    batch_encode_nice: int = Field(
        default=10, ge=0, le=19, description="CPU niceness of a batch-lane job's output encode (0 = as interactive): "
        "an interactive shot's encode takes the cores first.",
    )
    interactive_quiet_s: float = Field(
        default=3.0, ge=0, description="Seconds a batch-lane job's TIFF writes may wait in all while interactive "
        "shots write theirs, so those reach the disk first (services/jobs/quiet.py); 0 = never wait.",
    )
    gpu_encode: bool = Field(
        default=True, description="Workers bin resized outputs (proofs) in linear light beside each strip they "
                                  "render; the writer bins only rows that straddle two strips.")
    worker_proofs: bool = Field(
        default=True, description="A worker whose strip holds the whole image (one GPU, a shot that fits) also "
        "finishes each resized output from its bins (filter, transfer, sharpening, 8-bit codes) on its device; the "
        "writer then only encodes the file. Needs STRATA_GPU_ENCODE.")
    worker_tiffs: bool = Field(
        default=True, description="A GPU worker whose strip holds the whole image of an interactive shot also writes "
        "the full-size 16-bit deflate TIFF itself, from the tiles it compressed, durably; the finalize then only "
        "moves it into the job's outputs (local storage; batch-lane jobs keep the coordinator's write, which yields "
        "the disk to interactive shots).")
    gpu_deflate: Literal["off", "batch", "on"] = Field(
        default="on", description="Which jobs' 16-bit deflate TIFF tiles GPU workers compress with nvCOMP (where "
        "the nvidia-nvcomp wheel is installed; elsewhere the writer's CPU does): every job (default: about 9 "
        "core-seconds a frame leave the CPU; an idle 80 MP shot took 1.29 s against 1.53 s with the CPU's 16 "
        "threads, docs/PERFORMANCE.md), batch-lane jobs only, or none. true / false mean on / off.")
    gpu_deflate_level: int = Field(default=0, ge=0, le=5, description="nvCOMP deflate algorithm type (0-5); 0 is "
                                   "the fastest, and no type compresses a 16-bit render more than 1.5 % smaller.")
    lean_strips: bool = Field(
        default=True, description="When every output of a colour space is made from what the GPU workers make "
        "beside the strips (deflate TIFF tiles, proof bins, the final preview's sums), a worker that made them all "
        "downloads only the strip's rows straddling its neighbours, not its whole full-resolution render.")
    stack_detail_band: bool = Field(
        default=True, description="Sub-pixel stacks split each frame's warped render into a base, averaged over every "
        "frame, and a detail band averaged with each frame's warp reliability (1 at whole-pixel offsets, 0 at half a "
        "pixel: no interpolator recovers the finest detail there): +0.0..+0.4 dB on photo stacks at mid noise, up to "
        "+0.8 where the frames' fractions lie near half a pixel (docs/QUALITY.md); accumulators 36 bytes a pixel "
        "instead of 20.")
    stack_raw_merge: bool = Field(
        default=False, description="Sub-pixel stacks also merge the frames' raw samples per colour onto the output "
                                   "grid (multi-frame demosaicking, docs/QUALITY.md); accumulators 24 bytes a pixel "
                                   "more, and 4 more model passes per stack strip.")
    recipes_file: Path | None = Field(
        default=None, description="A studio's recipes (TOML, docs/RECIPES.md), added to the built-in ones."
    )

    # Failure drills: an artificial pause inside every shard, so a worker can be killed mid-shard.
    fault_shard_delay_s: float = 0.0
    fault_ingest_delay_s: float = Field(default=0.0, description="Drills only: ingest pauses this long mid-decode.")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="INFO", description="DEBUG | INFO | WARNING | ERROR | CRITICAL (any case).")
    log_format: Literal["text", "json"] = Field(
        default="text", description="text | json (one JSON object a line, with job/shard ids).")
    metrics_dir: Path | None = Field(
        default=None, description="Prometheus multiprocess folder shared by every process; default data_dir/metrics."
    )
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="`strata workers` / `strata coordinator` serve this host's metrics "
        "folder on this port (a host without an API; 0: off).")
    migrate_on_start: bool = Field(default=True, description="The API upgrades the database when it starts.")
    token: str | None = Field(default=None, description="Bearer token `strata submit` uses (else the local one).")
    api_url: str = Field(default="http://127.0.0.1:8000", description="Where `strata submit` finds the API.")
    remember_last_service: bool = Field(
        default=True, description="`strata serve` also names itself in ~/.config/strata (drills and tests: false)."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        return str(value).strip().upper()

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        """An IANA zone this host knows: refused at start, not by every batch's admission pass."""
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}: an IANA name such as Europe/Paris or UTC") from exc
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        """s3://bucket[/prefix] or file:///absolute/path (or unset): refused at start, not at the first upload."""
        if not value:
            return None
        if value.startswith("s3://"):
            bucket = value.removeprefix("s3://").partition("/")[0]
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{1,254}", bucket):
                raise ValueError(f"{value!r}: s3://bucket/prefix needs a bucket name (3-255 letters, digits, '.', "
                                 f"'-', '_')")
            return value
        if value.startswith("file://"):
            if not value.removeprefix("file://").startswith("/"):
                raise ValueError(f"{value!r}: file:// needs an absolute path (file:///srv/strata)")
            return value
        raise ValueError(f"{value!r}: must be s3://bucket/prefix or file:///path")

    @field_validator("gpu_deflate", mode="before")
    @classmethod
    def _deflate_mode(cls, value: object) -> object:
        """true / false (the setting's earlier form) as on / off."""
        text = str(value).strip().lower()
        return {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}.get(text, text)

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
    def resolved_scratch_dir(self) -> Path:
        return (self.scratch_dir or self.data_dir / "scratch").resolve()

    @property
    def host_name(self) -> str:
        import socket

        return self.node_name or socket.gethostname()

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 1024 * 1024

    @property
    def token_file(self) -> Path:
        return self.data_dir / "local-token"


# STRATA_ variables that are not settings but are read elsewhere: the CLI's, `strata serve`'s own, the tests'.
_OTHER_VARIABLES = frozenset({"STRATA_RETRY_FOR", "STRATA_SERVE_INSTANCE", "STRATA_GPU_IDS"})


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per STRATA_ variable in the environment that no setting reads, with the setting it was probably
    meant to be: found from outside, ``STRATA_STORAGE_UR=s3://…`` was ignored without a word and that host wrote
    to local storage."""
    known = {"STRATA_" + name.upper() for name in Settings.model_fields} | {"STRATA_GPU_ID"} | _OTHER_VARIABLES
    lines = []
    for name in sorted(environ if environ is not None else os.environ):
        upper = name.upper()
        if not upper.startswith("STRATA_") or upper in known or upper.startswith("STRATA_TEST_"):
            continue
        near = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        lines.append(f"{name} is not a Strata setting and is ignored" + (f" (did you mean {near[0]}?)" if near else ""))
    return lines


def settings_problems(error: ValidationError) -> list[str]:
    """One line per setting pydantic refused: its environment variable, the value given and why."""
    lines = []
    for e in error.errors():
        name = ".".join(str(part) for part in e["loc"]) or "?"
        var = name if name.startswith("STRATA_") else f"STRATA_{name.upper()}"
        lines.append(f"{var}={os.environ.get(var, e.get('input', ''))!s}: {e['msg']}")
    return lines


def settings_or_exit() -> Settings:
    """The settings; a bad STRATA_* variable prints one line each and exits 2 (every entry point: the CLI, the API
    under any server; found from outside: `uvicorn api.app:create_app` showed a 24-frame traceback)."""
    try:
        return get_settings()
    except ValidationError as exc:
        for line in settings_problems(exc):
            print(f"strata: invalid setting {line} (docs/OPERATIONS.md lists the settings)", file=sys.stderr)
        raise SystemExit(2) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, created once."""
    return Settings()
