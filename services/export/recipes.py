"""Output recipes: the named presets a job can ask for."""

from __future__ import annotations

from dataclasses import dataclass

from services.errors import BadInput


@dataclass(frozen=True)
class Recipe:
    """An output preset. ``colour_space`` is a key of ``services.raw.colour.OUTPUT_SPACES``: the
    space the pipeline renders to (DNG colorimetric, its own transfer function, no tone curve) and whose ICC
    profile is embedded."""

    name: str
    colour_space: str  # "srgb", "adobergb", "prophoto" or "linear"
    compression: str | None  # TIFF compression (None = uncompressed)
    description: str


RECIPES: dict[str, Recipe] = {
    "tiff16": Recipe("tiff16", "srgb", "zstd", "16-bit sRGB TIFF, tiled, zstd, ICC profile embedded"),
    "tiff16-uncompressed": Recipe("tiff16-uncompressed", "srgb", None, "16-bit sRGB TIFF, tiled, uncompressed"),
    "tiff16-adobergb": Recipe("tiff16-adobergb", "adobergb", "zstd", "16-bit Adobe RGB (1998) TIFF, ICC embedded"),
    "tiff16-prophoto": Recipe("tiff16-prophoto", "prophoto", "zstd", "16-bit ProPhoto RGB TIFF, ICC embedded"),
    "tiff16-linear": Recipe("tiff16-linear", "linear", "zstd",
                            "16-bit linear sRGB (Rec. 709 primaries, D65, no transfer curve) TIFF, ICC embedded"),
}
DEFAULT_RECIPE = "tiff16"


def get_recipe(name: str | None) -> Recipe:
    """The recipe ``name`` (default ``tiff16``); ``BadInput`` naming the choices otherwise."""
    recipe = RECIPES.get((name or DEFAULT_RECIPE).strip())
    if recipe is None:
        raise BadInput(f"unknown recipe {name!r}; expected one of {', '.join(RECIPES)}")
    return recipe
