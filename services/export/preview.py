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


TAG_ORIENTATION = 274


def encode_jpeg(rgb: np.ndarray, long_edge: int = LONG_EDGE, quality: int = JPEG_QUALITY, orientation: int = 1
                ) -> bytes:
    """Resize to the long edge (area filter, never up) and encode as a baseline sRGB JPEG. ``orientation``: the
    shot's EXIF Orientation (1..8), written as the JPEG's own (browsers and viewers turn the image as the camera
    was held, as they do the proofs and TIFFs); 1 writes no EXIF block."""
    image = Image.fromarray(np.ascontiguousarray(rgb), mode="RGB")
    size = fit_size(rgb.shape[0], rgb.shape[1], long_edge)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BOX)
    extra = {}
    if orientation != 1 and 1 <= orientation <= 8:
        exif = Image.Exif()
        exif[TAG_ORIENTATION] = orientation
        extra["exif"] = exif.tobytes()
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, optimize=False, **extra)
    return buf.getvalue()


def write_preview(storage: Storage, job_id: str, rgb: np.ndarray, orientation: int = 1) -> str:
    """Write the job's preview JPEG (``orientation`` as :func:`encode_jpeg`); returns its ETag (SHA-256 of the
    bytes, first 32 hex digits)."""
    return store_preview(storage, job_id, encode_jpeg(rgb, orientation=orientation))


def store_preview(storage: Storage, job_id: str, data: bytes) -> str:
    """Store an encoded preview JPEG as the job's; returns its ETag (as :func:`write_preview`)."""
    with storage.path_writer(preview_key(job_id)) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()[:32]
