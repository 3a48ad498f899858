"""Output recipes as data: the named presets a job can ask for (built in, plus a studio's TOML file).

A recipe says how one output file is made from the render: format and bit depth, colour space (and its ICC
profile), TIFF compression, JPEG quality, resize by long edge (in linear light) with output sharpening, the
resolution written into the file, and the naming template (:mod:`services.export.naming`). The GPU renders one
16-bit image per colour space a job's recipes need; everything else a recipe asks for is derived on the CPU.

A studio adds or overrides recipes in the TOML file named by ``STRATA_RECIPES_FILE`` (docs/RECIPES.md)::

    [recipes.web-proof]
    format = "jpeg"
    long_edge = 2048
    quality = 85
    naming = "{station}_{stem}_web"

A table may start from another recipe with ``base = "jpeg-proof"``; the file is validated when it is loaded,
and every error names the file and the recipe.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from services.errors import BadInput
from services.export.naming import BadNaming, validate_template

log = logging.getLogger(__name__)
DEFAULT_RECIPE = "tiff16"
MAX_RECIPES_PER_JOB = 8


class Format(StrEnum):
    TIFF = "tiff"
    JPEG = "jpeg"
    PNG = "png"


class Space(StrEnum):
    SRGB = "srgb"
    ADOBERGB = "adobergb"
    PROPHOTO = "prophoto"
    LINEAR = "linear"


class ModelTier(StrEnum):
    """Which learned package renders the shot (services.pipeline.models.registry): ``best``, the larger
    ``strata_jdd_v2``; ``fast``, ``strata_jdd_v1``: 0.02 s less GPU per 80 MP frame in float16, 0.3-0.7 dB lower PSNR
    (docs/QUALITY.md)."""

    BEST = "best"
    FAST = "fast"
    MAX = "max"  # the best package averaged over 4 orientations: +0.9 dB without noise, 4x its GPU time


class Compression(StrEnum):
    NONE = "none"
    DEFLATE = "deflate"  # with the horizontal predictor (TIFF Predictor 2)
    LZW = "lzw"  # with the horizontal predictor
    ZSTD = "zstd"  # TIFF compression 50000: not every reader has it


FORMAT_BITS = {"tiff": 16, "png": 16, "jpeg": 8}  # a recipe's depth when its file names a format and no bits
EXTENSIONS = {Format.TIFF: "tif", Format.JPEG: "jpg", Format.PNG: "png"}
MEDIA_TYPES = {Format.TIFF: "image/tiff", Format.JPEG: "image/jpeg", Format.PNG: "image/png"}


class UnknownRecipe(BadInput):
    """A recipe name no recipe has (the API's slug stays ``invalid_input``, as it always answered)."""


class BadRecipe(BadInput):
    """A recipe definition (a studio's file, or a template given at job creation) that cannot be used."""

    type = "invalid_recipe"


class Recipe(BaseModel):
    """One output preset (immutable). ``naming`` None: ``{stem}`` for the default recipe, else
    ``{stem}_{recipe}`` (so two recipes of one job never collide)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    format: Format = Format.TIFF
    bits: int = Field(default=16, validate_default=True)
    space: Space = Space.SRGB
    compression: Compression = Compression.DEFLATE
    quality: int = Field(default=90, ge=1, le=100)
    long_edge: int | None = Field(default=None, ge=16, le=100_000)
    sharpen: float = Field(default=0.0, ge=0.0, le=5.0)
    ppi: float = Field(default=300.0, gt=0, le=100_000)
    naming: str | None = None
    description: str = ""
    # The model package tier this output asks for; None: the service's STRATA_MODEL_TIER. One render serves all
    # of a job's recipes, so a job renders `best` when any of them asks for it (job_model_tier).
    model: ModelTier | None = None

    @field_validator("naming")
    @classmethod
    def _naming(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                validate_template(value)
            except BadNaming as exc:
                raise ValueError(exc.detail) from None
        return value

    # Field validators (format is validated before them), so an error names the field: "bits: jpeg output is
    # 8-bit, not 16" (found from outside: a model validator's error said "recipe: Value error, …").
    @field_validator("bits")
    @classmethod
    def _bits_fit_the_format(cls, bits: int, info: ValidationInfo) -> int:
        fmt = info.data.get("format")  # absent where the format itself was refused
        allowed = {Format.TIFF: (8, 16), Format.JPEG: (8,), Format.PNG: (8, 16)}.get(fmt, (bits,)) if fmt else (bits,)
        if bits not in allowed:
            raise ValueError(f"{fmt} output is {' or '.join(map(str, allowed))}-bit, not {bits}")
        return bits

    @field_validator("compression")
    @classmethod
    def _compression_fits_the_format(cls, compression: Compression, info: ValidationInfo) -> Compression:
        fmt = info.data.get("format")
        if fmt in (Format.JPEG, Format.PNG) and compression not in (Compression.DEFLATE, Compression.NONE):
            raise ValueError(f"compression {compression.value!r} is for TIFF; {fmt} has its own")
        return compression

    @property
    def colour_space(self) -> str:
        """The output space's key in ``services.raw.colour.OUTPUT_SPACES``."""
        return self.space.value

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.format]

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    @property
    def template(self) -> str:
        """The naming template in effect (see the class doc)."""
        if self.naming is not None:
            return self.naming
        return "{stem}" if self.name == DEFAULT_RECIPE else "{stem}_{recipe}"

    @property
    def derived(self) -> bool:
        """Whether the file needs more than the 16-bit strips of its space (8 bits or a resize)."""
        return self.bits != 16 or self.long_edge is not None

    def to_public(self) -> dict[str, Any]:
        """The recipe as ``GET /v1/recipes`` lists it (naming: the template in effect)."""
        return {**self.model_dump(mode="json"), "naming": self.template, "extension": self.extension,
                "media_type": self.media_type}


def _builtin(name: str, description: str, **fields: Any) -> Recipe:
    return Recipe(name=name, description=description, **fields)


BUILTIN_RECIPES: dict[str, Recipe] = {r.name: r for r in (
    _builtin("tiff16", "16-bit sRGB TIFF, tiled, deflate + predictor, ICC profile embedded"),
    _builtin("tiff16-uncompressed", "16-bit sRGB TIFF, tiled, uncompressed", compression="none"),
    _builtin("tiff16-zstd", "16-bit sRGB TIFF, tiled, zstd (smaller and faster; not every reader has it)",
             compression="zstd"),
    _builtin("tiff16-adobergb", "16-bit Adobe RGB (1998) TIFF, ICC embedded", space="adobergb"),
    _builtin("tiff16-prophoto", "16-bit ProPhoto RGB TIFF, ICC embedded", space="prophoto"),
    _builtin("tiff16-linear", "16-bit linear sRGB (Rec. 709 primaries, D65, no transfer curve) TIFF, ICC embedded",
             space="linear"),
    _builtin("tiff8", "8-bit sRGB TIFF, deflate + predictor, ICC embedded", bits=8),
    _builtin("tiff16-fast", "16-bit sRGB TIFF like tiff16, rendered with the fast model package (less GPU time, "
             "a little less detail and noise reduction)", model="fast"),
    _builtin("tiff16-max", "16-bit sRGB TIFF like tiff16, the best package averaged over four orientations "
             "(single frames: 0.25-0.9 dB higher PSNR, 4x the model's GPU time)", model="max"),
    _builtin("jpeg-proof", "sRGB JPEG proof, 1600 px long edge, quality 90, light output sharpening",
             format="jpeg", bits=8, long_edge=1600, quality=90, sharpen=0.4),
    _builtin("jpeg", "Full-size sRGB JPEG, quality 92", format="jpeg", bits=8, quality=92),
    _builtin("png16", "16-bit sRGB PNG, ICC embedded", format="png", bits=16),
)}


RECIPES = BUILTIN_RECIPES  # the name older callers import


def _error(origin: str, name: str, exc: ValidationError | str) -> BadRecipe:
    if isinstance(exc, str):
        return BadRecipe(f"{origin}: recipe {name!r}: {exc}")
    reasons = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'recipe'}: {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors())
    return BadRecipe(f"{origin}: recipe {name!r}: {reasons}")


def parse_recipes(tables: Mapping[str, Any], origin: str, known: Mapping[str, Recipe]) -> dict[str, Recipe]:
    """Validate the ``[recipes.<name>]`` tables of a studio file against the ``known`` recipes (for ``base``)."""
    out: dict[str, Recipe] = {}
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            raise _error(origin, name, "must be a table of fields")
        fields = dict(table)
        base_name = fields.pop("base", None)
        base = {**known, **out}.get(str(base_name)) if base_name is not None else None
        if base_name is not None and base is None:
            raise _error(origin, name, f"base {base_name!r} is not a recipe defined before it")
        start = base.model_dump(exclude={"name", "description"}) if base is not None else {}
        if "format" in fields and "bits" not in fields:  # the new format's depth, not the base's or TIFF's 16
            start.pop("bits", None)
            fields["bits"] = FORMAT_BITS.get(str(fields["format"]).lower(), 16)
        try:
            out[name] = Recipe(**{**start, **fields, "name": name})
        except ValidationError as exc:
            raise _error(origin, name, exc) from None
    return out


def load_recipes_file(path: Path) -> dict[str, Recipe]:
    """The built-ins with the studio file's recipes added or overriding them; :class:`BadRecipe` naming the file
    (and the recipe) when it cannot be read or a recipe is invalid."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadRecipe(f"{path}: cannot read the recipes file: {exc}") from None
    unknown = set(data) - {"recipes"}
    if unknown or not isinstance(data.get("recipes", {}), Mapping):
        raise BadRecipe(f"{path}: expected only [recipes.<name>] tables, got {sorted(unknown) or ['recipes']}")
    return {**BUILTIN_RECIPES, **parse_recipes(data.get("recipes", {}), str(path), BUILTIN_RECIPES)}


_CACHE: dict[tuple[str, int, int], dict[str, Recipe]] = {}
_LAST_GOOD: dict[str, dict[str, Recipe]] = {}  # per file: the recipes as this process last read them whole
_REPORTED: set[str] = set()  # errors already logged (one line per broken version of the file, not per job)


def catalogue(path: Path | None = None, *, strict: bool = False) -> dict[str, Recipe]:
    """Every recipe available now: the built-ins, plus the file at ``path`` (default: ``STRATA_RECIPES_FILE``).
    The file is re-read when it changes (its size or modification time). A file that cannot be read or holds an
    invalid recipe (an edit half done, a typo) leaves the recipes as this process last read them in use, with an
    error in the log, so shots already queued do not fail for it; :class:`BadRecipe` where this process never
    read it whole, and always with ``strict`` (the recipe listing, where whoever edited the file looks)."""
    if path is None:
        from services.config import get_settings

        path = get_settings().recipes_file
    if path is None:
        return BUILTIN_RECIPES
    try:
        stat = Path(path).stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in _CACHE:
            recipes = load_recipes_file(Path(path))
            _CACHE.clear()
            _CACHE[key] = _LAST_GOOD[str(path)] = recipes
        return _CACHE[key]
    except OSError as exc:
        error = BadRecipe(f"{path}: cannot read the recipes file: {exc}")
    except BadRecipe as exc:
        error = exc
    good = _LAST_GOOD.get(str(path))
    if good is None or strict:
        raise error
    if str(error) not in _REPORTED:
        _REPORTED.add(str(error))
        log.error("%s; the recipes as last read stay in use until the file is fixed", error)
    return good


def read_at_start() -> None:
    """A process's first read of the recipes file (API and workers, at start): from then on a broken edit of it
    leaves these recipes in use (:func:`catalogue`); a file unreadable now is logged, not fatal."""
    try:
        catalogue()
    except BadRecipe as exc:
        log.error("%s", exc)


def get_recipe(name: str | None, recipes: Mapping[str, Recipe] | None = None) -> Recipe:
    """The recipe ``name`` (default ``tiff16``); :class:`UnknownRecipe` naming the choices otherwise."""
    known = catalogue() if recipes is None else recipes
    wanted = (name or DEFAULT_RECIPE).strip()
    recipe = known.get(wanted)
    if recipe is None:  # TIFF16 for tiff16, where that names one recipe (cameras and priorities ignore case too)
        matches = [r for key, r in known.items() if key.lower() == wanted.lower()]
        recipe = matches[0] if len(matches) == 1 else None
    if recipe is None:
        raise UnknownRecipe(f"unknown recipe {name!r}; expected one of {', '.join(known)}")
    return recipe


def resolve_recipes(names: Iterable[str] | None, recipes: Mapping[str, Recipe] | None = None) -> list[Recipe]:
    """A job's recipes: duplicates dropped (also one named in another case: ``web,WEB``), order kept, at most
    :data:`MAX_RECIPES_PER_JOB`; none: the default."""
    unique = list(dict.fromkeys(n.strip() for n in (names or ()) if n and n.strip()))
    _at_most_max(len({n.lower() for n in unique}))  # before resolving a long list (TIFF16 and tiff16: one)
    chosen = list({r.name: r for r in (get_recipe(n, recipes) for n in unique)}.values())
    _at_most_max(len(chosen))  # a studio's 'web' and 'WEB' are two
    return chosen or [get_recipe(None, recipes)]


def _at_most_max(count: int) -> None:
    if count > MAX_RECIPES_PER_JOB:
        raise BadInput(f"{count} recipes asked for; at most {MAX_RECIPES_PER_JOB} per job")


RECIPE_DEFS = "recipe_defs"  # jobs.params: the job's recipes as they were when it was accepted


def recipe_snapshot(recipes: Iterable[Recipe]) -> list[dict[str, Any]]:
    """The recipes' definitions as a job records them when accepted (:data:`RECIPE_DEFS`)."""
    return [r.model_dump(mode="json") for r in recipes]


def recipes_of_job(params: Mapping[str, Any], names: Iterable[str]) -> list[Recipe]:
    """A job's recipes as they were when it was accepted, so an edit of the recipes file (a renamed or broken
    recipe, a process that has not re-read it yet) does not change or fail the shots already queued; jobs
    accepted before the snapshot existed resolve their ``names`` now."""
    defs = params.get(RECIPE_DEFS)
    if defs:
        return [Recipe.model_validate(d) for d in defs]
    return resolve_recipes(names)


def job_model_tier(recipes: Iterable[Recipe], default: str) -> str:
    """The package tier a job renders with: the most thorough any recipe asks for (``max``, then ``best``, then
    ``fast``), else ``default`` (the setting)."""
    asked = {r.model for r in recipes if r.model is not None}
    for tier in (ModelTier.MAX, ModelTier.BEST, ModelTier.FAST):
        if tier in asked:
            return tier.value
    return default


def job_spaces(recipes: Iterable[Recipe]) -> list[str]:
    """The distinct colour spaces of a job's recipes, first recipe's first (the render's primary space)."""
    return list(dict.fromkeys(r.colour_space for r in recipes))
