"""The preview writer: an (h, w, 3) uint8 sRGB array -> a JPEG in storage (written atomically) and its ETag."""

from __future__ import annotations

import hashlib
import io

import numpy as np
from PIL import Image

from services.pipeline.preview import LONG_EDGE, fit_size
from services.storage.base import Storage
from services.storage.keys import preview_key

JPEG_QUALITY = 85


def encode_jpeg(rgb: np.ndarray, long_edge: int = LONG_EDGE, quality: int = JPEG_QUALITY) -> bytes:
    """Resize to the long edge (area filter, never up) and encode as a baseline sRGB JPEG."""
    image = Image.fromarray(np.ascontiguousarray(rgb), mode="RGB")
    size = fit_size(rgb.shape[0], rgb.shape[1], long_edge)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BOX)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, optimize=False)
    return buf.getvalue()


def write_preview(storage: Storage, job_id: str, rgb: np.ndarray) -> str:
    """Write the job's preview JPEG; returns its ETag (SHA-256 of the bytes, first 32 hex digits)."""
    return store_preview(storage, job_id, encode_jpeg(rgb))


def store_preview(storage: Storage, job_id: str, data: bytes) -> str:
    """Store an encoded preview JPEG as the job's; returns its ETag (as :func:`write_preview`)."""
    with storage.path_writer(preview_key(job_id)) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()[:32]
