"""Errors of model packages: a corrupt package, and a package that does not fit what was asked of it."""

from __future__ import annotations

from services.errors import StrataError


class ModelPackageError(StrataError):
    """A model package cannot be read: missing file, bad manifest, weights that fail their checksum."""

    status_code = 500
    type = "model_package_error"


class ModelMismatch(ModelPackageError):
    """A package loaded for the wrong camera or architecture ("model architecture mismatch: ...")."""

    type = "model_mismatch"
