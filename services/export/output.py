"""A job's output files: one per recipe, named from the recipe's template, written from the rendered strips of
the recipe's colour space, recorded by the job state machine. The one place that writes files for people.

Full-size 16-bit TIFFs are cut tile by tile from the memory-mapped strips (no stitched copy); 8-bit and resized
outputs are derived from the same strips on the CPU (:mod:`services.export.derive`). The same strips give the
same bytes: every embedded ICC profile and tag is deterministic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from services.errors import IntermediateLost
from services.export.derive import PreBinned, ProofSpec, derive_bands, fit_long_edge, proof_spec, stitch
from services.export.images import write_jpeg, write_png
from services.export.metadata import OutputMetadata, software_name, tiff_tags
from services.export.naming import NameTokens, render_name, unique_names
from services.export.recipes import Compression, Format, Recipe
from services.export.tiff import Bands, Pause, PreTiled, TiffTags, write_tiff
from services.raw.colour import output_space
from services.raw.meta import CaptureInfo
from services.storage.base import Storage
from services.storage.keys import output_key

log = logging.getLogger(__name__)

CONCURRENT_OUTPUTS = 4  # a job's files written at once (each TIFF also compresses on its own pool)


@dataclass(frozen=True)
class WrittenOutput:
    name: str
    storage_key: str
    sha256: str
    bytes: int
    recipe: str = ""
    media_type: str = "image/tiff"


def output_names(recipes: Sequence[Recipe], tokens: NameTokens) -> list[str]:
    """Each recipe's file name (its template), made unique in recipe order."""
    return unique_names([render_name(r.template, tokens, r.name, r.extension) for r in recipes])


def write_recipe(storage: Storage, key: str, bands: Bands, recipe: Recipe, meta: OutputMetadata, *,
                 threads: int = 0, pretiled: PreTiled = (), prebinned: Mapping[int, PreBinned] | None = None,
                 finished: np.ndarray | None = None, pause: Pause | None = None) -> tuple[str, int]:
    """Encode one recipe's file from the 16-bit bands of its colour space; returns (sha256, bytes). ``pretiled``:
    the space's GPU-compressed deflate tiles, used by a full-size 16-bit deflate TIFF; ``prebinned``: its
    linear-light bins by factor, used by a resized output; ``finished``: a resized output's codes a worker made
    (:func:`services.pipeline.binning.proof_from_bins`), written as they are; ``pause``: a batch-lane TIFF's
    yield to interactive shots (:func:`services.export.tiff.write_tiff`)."""
    space = recipe.colour_space
    t0 = time.perf_counter()
    if finished is not None and _fits(finished, bands, recipe):
        out: Bands = [(0, np.asarray(finished))]
    else:
        out = derive_bands(bands, bits=recipe.bits, long_edge=recipe.long_edge,
                           transfer=output_space(space).transfer, sharpen_amount=recipe.sharpen, prebinned=prebinned)
        if out is not bands:  # resized or 8-bit: where a proof's time goes before its file is written
            log.info("%s: derived (%s) in %.2fs", key, f"long edge {recipe.long_edge}" if recipe.long_edge else
                     f"{recipe.bits}-bit", time.perf_counter() - t0)
    stamped = OutputMetadata(meta.capture, meta.original_name, recipe.ppi, meta.software)
    if recipe.format == Format.TIFF:
        tags = recipe_tags(space, stamped)
        return write_tiff(storage, key, out, colour_space=space, compression=recipe.compression.value,
                          threads=threads, software=tags.software, ppi=tags.ppi, description=tags.description,
                          extratags=tags.extratags,
                          pretiled=pretiled if out is bands and recipe.bits == 16 else (), pause=pause)
    image = stitch(out)
    if recipe.format == Format.JPEG:
        return write_jpeg(storage, key, image, colour_space=space, quality=recipe.quality, meta=stamped)
    return write_png(storage, key, image, colour_space=space, meta=stamped)


@dataclass(frozen=True)
class WorkerFile:
    """A recipe's file a GPU worker wrote durably (its strip held the whole image), with its SHA-256 and size."""

    key: str
    sha256: str
    bytes: int

    def move_to(self, storage: Storage, job_id: str, key: str) -> None:
        """Move the file to the output ``key``; a finalize run again after an earlier one moved it finds it
        there. Gone from both (e.g. a host crash lost the worker's record): the job starts over."""
        t0 = time.perf_counter()
        if storage.exists(self.key):
            storage.move(self.key, key)
        elif not (storage.exists(key) and storage.size(key) == self.bytes):
            raise IntermediateLost(job_id, self.key, "the file a worker wrote is neither where it wrote it nor "
                                   "in the outputs")
        log.info("%s: %.1f MB written by the GPU worker, moved into place in %.3fs", key, self.bytes / 1e6,
                 time.perf_counter() - t0)


def recipe_tags(space: str, stamped: OutputMetadata) -> TiffTags:
    """A TIFF's space and tags from its shot's metadata stamped with the recipe's resolution."""
    return TiffTags(space, stamped.software_text, stamped.ppi,
                    stamped.original_name.encode("ascii", "replace").decode(), tuple(tiff_tags(stamped)))


@dataclass(frozen=True)
class FileSpec:
    """What a full-size 16-bit deflate TIFF that a GPU worker writes from its strip's tiles records, fixed when
    the job is planned (:func:`services.jobs.plan.file_plan`): the finalize moves the file into the job's outputs
    only where the recipe it would write now has the same spec (a recipe changed meanwhile is written anew)."""

    space: str
    ppi: float
    original: str  # the shot's file name as the station sent it (DocumentName, ImageDescription)
    software: str

    def tags(self, capture: CaptureInfo) -> TiffTags:
        return recipe_tags(self.space, OutputMetadata(capture, self.original, self.ppi, self.software))

    def to_list(self) -> list[object]:
        return [self.space, self.ppi, self.original, self.software]

    @classmethod
    def from_list(cls, v: Sequence[object]) -> FileSpec:
        return cls(str(v[0]), float(v[1]), str(v[2]), str(v[3]))  # type: ignore[arg-type]


def written_by_worker(recipe: Recipe) -> bool:
    """Whether ``recipe``'s file is one a GPU worker can write from its strip's tiles: a full-size 16-bit
    deflate TIFF."""
    return (recipe.format == Format.TIFF and recipe.bits == 16 and recipe.long_edge is None
            and recipe.compression == Compression.DEFLATE)


def file_spec(recipe: Recipe, original: str) -> FileSpec:
    return FileSpec(recipe.colour_space, recipe.ppi, original, software_name())


def _fits(finished: np.ndarray, bands: Bands, recipe: Recipe) -> bool:
    """Whether a worker's finished output has the size and code depth ``recipe`` makes from ``bands``."""
    if recipe.long_edge is None or not bands:
        return False
    height, width = sum(np.asarray(b).shape[0] for _, b in bands), np.asarray(bands[0][1]).shape[1]
    return finished.shape == (*fit_long_edge(height, width, recipe.long_edge), 3) and finished.dtype == (
        np.uint16 if recipe.bits == 16 else np.uint8)


def write_outputs(storage: Storage, job_id: str, spaces: Mapping[str, Bands], recipes: Sequence[Recipe],
                  tokens: NameTokens, meta: OutputMetadata, *, threads: int = 0,
                  pretiled: Mapping[str, PreTiled] | None = None,
                  prebinned: Mapping[str, Mapping[int, PreBinned]] | None = None,
                  proofs: Mapping[ProofSpec, np.ndarray] | None = None,
                  pause: Pause | None = None, moved: Mapping[int, WorkerFile] | None = None) -> list[WrittenOutput]:
    """Write every recipe's file into the job's output folder, atomically and durably, from ``spaces`` (the
    16-bit bands of each colour space the recipes need); one :class:`WrittenOutput` per recipe, in order.
    ``proofs``: resized outputs the workers finished, by (space, long edge, bits, sharpen amount); ``pause``:
    the TIFFs' yield to interactive shots (a batch-lane job's, :mod:`services.jobs.quiet`); ``moved``: files a GPU
    worker already wrote (durably) for the recipe at that position, moved into place instead of written.

    The files are written at once, one thread each (up to :data:`CONCURRENT_OUTPUTS`): a proof's resize and JPEG
    overlap the TIFF's write, fsync and hash, which wait on the disk and release the GIL (a batch frame with a
    proof held a coordinator slot 0.6 s longer with them one after the other, docs/PERFORMANCE.md)."""
    names = output_names(recipes, tokens)
    for recipe in recipes:
        if recipe.colour_space not in spaces:  # e.g. the studio file changed the recipe after the job was planned
            raise ValueError(f"recipe {recipe.name!r} needs a {recipe.colour_space} render; the job rendered "
                             f"{', '.join(spaces)}")

    def write(index: int, recipe: Recipe, name: str) -> WrittenOutput:
        key = output_key(job_id, name)
        made = (moved or {}).get(index)
        if made is not None:
            made.move_to(storage, job_id, key)
            return WrittenOutput(name, key, made.sha256, made.bytes, recipe.name, recipe.media_type)
        sha, size = write_recipe(storage, key, spaces[recipe.colour_space], recipe, meta, threads=threads,
                                 pretiled=(pretiled or {}).get(recipe.colour_space, ()),
                                 prebinned=(prebinned or {}).get(recipe.colour_space),
                                 finished=(proofs or {}).get(proof_spec(recipe)), pause=pause)
        return WrittenOutput(name, key, sha, size, recipe.name, recipe.media_type)

    if len(recipes) == 1:
        return [write(0, recipes[0], names[0])]
    with ThreadPoolExecutor(min(len(recipes), CONCURRENT_OUTPUTS), thread_name_prefix="strata-output") as pool:
        futures = [pool.submit(write, i, recipe, name) for i, (recipe, name) in enumerate(zip(recipes, names,
                                                                                               strict=True))]
        return [f.result() for f in futures]  # in recipe order; the first error raised (after all have ended)
