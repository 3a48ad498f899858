"""A job's output files: named from the shot, written from the rendered strips by the recipe, recorded by the
job state machine. The one place that writes files for people."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.export.recipes import get_recipe
from services.export.tiff import Bands, write_tiff
from services.storage.base import Storage
from services.storage.keys import output_key


@dataclass(frozen=True)
class WrittenOutput:
    name: str
    storage_key: str
    sha256: str
    bytes: int


def output_name(first_frame: str) -> str:
    """The TIFF's file name: the first frame's stem (already a safe name) + ``.tif``."""
    return f"{Path(first_frame).stem}.tif"


def write_output(storage: Storage, job_id: str, first_frame: str, bands: Bands, recipe: str, *,
                 threads: int = 0) -> WrittenOutput:
    """Encode the rendered image (its row bands, memory-mapped strips) with ``recipe`` into the job's output
    folder, atomically and durably; same bytes for the same bands."""
    name = output_name(first_frame)
    key = output_key(job_id, name)
    r = get_recipe(recipe)
    sha, size = write_tiff(storage, key, bands, colour_space=r.colour_space, compression=r.compression,
                           threads=threads)
    return WrittenOutput(name, key, sha, size)
