"""The storage key layout of a job, in one place: uploads, decoded frames, shard results, outputs.

```
jobs/<id>/frames/NN_<name>          uploads (durable)
jobs/<id>/raw/NN.npy                decoded mosaics (intermediate)
jobs/<id>/p<phase>/<kind>_NNN.npy   shard results: strips, frame-group accumulators (intermediate)
jobs/<id>/p<phase>/strip_NNN.<space>.npy  a strip in a further output space (a job whose recipes need several)
jobs/<id>/p<phase>/strip_NNN[.<space>].tiles.npy / .tidx.npy  its TIFF tiles compressed on the GPU, their index
jobs/<id>/p<phase>/strip_NNN[.<space>].bin<k>.npy  its linear-light k x k bins, made on the GPU (resized outputs)
jobs/<id>/p<phase>/strip_NNN[.<space>].psum<k>.npy  its k x k code sums for the final preview (the sRGB result's)
jobs/<id>/p<phase>/strip_NNN[.<space>].tif / .tif.json  the whole TIFF a worker wrote from it, its SHA-256 and size
jobs/<id>/p<phase>/frame_group_NNN.pending  a frame group still being stored after its task (a marker)
jobs/<id>/out/<name>                outputs (durable)
jobs/<id>/preview.jpg               the JPEG preview (durable; fast at ingest, replaced at finalize)
```
"""

from __future__ import annotations

# Sub-folders of a job holding intermediates: deleted when the job ends (or starts over).
INTERMEDIATE_FOLDERS = ("raw", "p0", "p1", "p2", "p3")


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}"


def frame_key(job_id: str, index: int, name: str) -> str:
    """Where upload ``index`` (its safe file name ``name``) is stored."""
    return f"jobs/{job_id}/frames/{index:02d}_{name}"


def raw_key(job_id: str, index: int) -> str:
    """The decoded mosaic of frame ``index`` (uint16 ``.npy``)."""
    return f"jobs/{job_id}/raw/{index:02d}.npy"


def shard_key(job_id: str, phase: int, kind: str, index: int) -> str:
    """The result of shard ``index`` of ``phase`` (``kind``: strip or frame_group)."""
    return f"jobs/{job_id}/p{phase}/{kind}_{index:03d}.npy"


def space_shard_key(job_id: str, phase: int, kind: str, index: int, space: str) -> str:
    """The result of strip ``index`` of ``phase`` in the further output space ``space``."""
    return f"jobs/{job_id}/p{phase}/{kind}_{index:03d}.{space}.npy"


def tile_keys(result_key: str) -> tuple[str, str]:
    """Where a strip result's GPU-compressed TIFF tiles (uint8 streams) and their index (int64) are kept."""
    stem = result_key.removesuffix(".npy")
    return f"{stem}.tiles.npy", f"{stem}.tidx.npy"


def worker_file_keys(result_key: str) -> tuple[str, str]:
    """Where the whole TIFF a worker wrote from a strip result's tiles (a strip holding the whole image) is kept
    until the finalize moves it into the outputs, and its record (SHA-256 and size, JSON)."""
    stem = result_key.removesuffix(".npy")
    return f"{stem}.tif", f"{stem}.tif.json"


def bin_key(result_key: str, factor: int) -> str:
    """Where a strip result's linear-light bins by ``factor`` (float32, for resized outputs) are kept."""
    return f"{result_key.removesuffix('.npy')}.bin{factor}.npy"


def proof_key(result_key: str, long_edge: int, bits: int, sharpen: float) -> str:
    """Where a resized output finished by a worker from a strip result's bins (its codes) is kept."""
    return f"{result_key.removesuffix('.npy')}.proof{long_edge}-{bits}-{sharpen:g}.npy"


def preview_sums_key(result_key: str, factor: int) -> str:
    """Where a strip result's block sums for the final preview (float32, ``binning.preview_sums``) are kept."""
    return f"{result_key.removesuffix('.npy')}.psum{factor}.npy"


def pending_key(key: str) -> str:
    """The marker that says the intermediate ``key`` is still being written by a worker's thread after its task
    (a frame group stored in the background, :mod:`services.pipeline.resident`)."""
    return f"{key.removesuffix('.npy')}{PENDING_SUFFIX}"


PENDING_SUFFIX = ".pending"


def output_key(job_id: str, name: str) -> str:
    return f"jobs/{job_id}/out/{name}"


def intermediate_prefixes(job_id: str) -> list[str]:
    return [f"jobs/{job_id}/{folder}" for folder in INTERMEDIATE_FOLDERS]


def preview_key(job_id: str) -> str:
    """The job's small sRGB JPEG preview."""
    return f"jobs/{job_id}/preview.jpg"
