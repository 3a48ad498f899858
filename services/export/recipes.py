"""Output recipes: the named presets a job can ask for."""

from __future__ import annotations

from dataclasses import dataclass

from services.errors import BadInput


@dataclass(frozen=True)
class Recipe:
    name: str
    colour_space: str  # the output space the pipeline renders to (and whose ICC profile is embedded)
    compression: str | None  # TIFF compression (None = uncompressed)
    description: str


RECIPES: dict[str, Recipe] = {
    "tiff16": Recipe("tiff16", "srgb", "zstd", "16-bit sRGB TIFF, tiled, zstd, ICC profile embedded"),
    "tiff16-uncompressed": Recipe("tiff16-uncompressed", "srgb", None, "16-bit sRGB TIFF, tiled, uncompressed"),
}
DEFAULT_RECIPE = "tiff16"


def get_recipe(name: str | None) -> Recipe:
    recipe = RECIPES.get((name or DEFAULT_RECIPE).strip())
    if recipe is None:
        raise BadInput(f"unknown recipe {name!r}; expected one of {', '.join(RECIPES)}")
    return recipe
