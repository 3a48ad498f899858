"""Model packages for the enhancement stage: manifest, loading with checks, the resident per-process cache.

``load_enhancer(camera, device)`` gives the :class:`Enhancer` that turns a white-balanced Bayer mosaic into
linear camera RGB (demosaic + denoise); its ``receptive_field`` sets the strip halo.
"""

from services.pipeline.models.base import Enhancer
from services.pipeline.models.errors import ModelMismatch, ModelPackageError
from services.pipeline.models.manifest import Manifest, halo_rows
from services.pipeline.models.package import load_package, read_package, write_package
from services.pipeline.models.registry import clear_cache, default_package, load_enhancer, package_manifest

__all__ = [
    "Enhancer",
    "Manifest",
    "ModelMismatch",
    "ModelPackageError",
    "clear_cache",
    "default_package",
    "halo_rows",
    "load_enhancer",
    "load_package",
    "package_manifest",
    "read_package",
    "write_package",
]
