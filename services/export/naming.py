"""Output file names from a recipe's naming template: tokens, validation, sanitising, collisions.

Tokens (docs/RECIPES.md): ``{station}`` the station's name, ``{camera}`` the camera model from the file (else the
job's camera profile), ``{capture_date}`` YYYY-MM-DD of the file's DateTimeOriginal (else the upload date, UTC),
``{stem}`` the first frame's safe stem, ``{seq}`` the job's sequence number within its station (1 for its first
job, 4 digits: ``0001``), ``{recipe}`` the recipe's name, ``{job}`` the job id. A template may hold no path
separator and no ``..``; every name is made ASCII-safe (``A-Z a-z 0-9 . _ -``, the rest ``_``) and at most
:data:`MAX_STEM` characters before the extension.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from services.errors import BadInput

TOKENS = ("station", "camera", "capture_date", "stem", "seq", "recipe", "job")
MAX_TEMPLATE = 200
MAX_STEM = 150
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class BadNaming(BadInput):
    type = "invalid_naming"


def validate_template(template: str) -> str:
    """``template`` when usable; :class:`BadNaming` for separators, ``..``, unknown tokens or format specs."""
    if not template.strip() or len(template) > MAX_TEMPLATE:
        raise BadNaming(f"naming template must be 1..{MAX_TEMPLATE} characters, not only spaces")
    if "/" in template or "\\" in template or ".." in template or "\0" in template:
        raise BadNaming(f"naming template {template!r} may not hold path separators or '..'")
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise BadNaming(f"naming template {template!r}: {exc}") from None
    for _, token, spec, conversion in fields:
        if token is None:
            continue
        if token in TOKENS and (spec or conversion):
            raise BadNaming(f"naming template {template!r}: {{{token}}} takes no format spec or conversion "
                            f"({'!' + conversion if conversion else ':' + (spec or '')}); write the token alone")
        if token not in TOKENS:
            raise BadNaming(f"naming template {template!r}: unknown token {{{token}}}; "
                            f"expected {', '.join('{' + t + '}' for t in TOKENS)}")
    return template


@dataclass(frozen=True)
class NameTokens:
    """The token values of one job's outputs (``recipe`` is filled per output)."""

    station: str
    camera: str
    capture_date: str
    stem: str
    seq: int
    job: str


def sanitise(text: str, limit: int = MAX_STEM, fallback: str = "output") -> str:
    """ASCII-safe, no separators, no leading dots, no ``..``, at most ``limit`` characters; ``fallback`` when
    nothing is left (never empty)."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    cleaned = _UNSAFE.sub("_", ascii_text)
    while ".." in cleaned:
        cleaned = cleaned.replace("..", ".")
    return cleaned.strip("._")[:limit].rstrip("._") or fallback


def render_name(template: str, tokens: NameTokens, recipe: str, extension: str) -> str:
    """The file name for one output: the template with its tokens, sanitised, plus ``.extension``."""
    validate_template(template)
    values = {"station": tokens.station, "camera": tokens.camera, "capture_date": tokens.capture_date,
              "stem": tokens.stem, "seq": f"{tokens.seq:04d}", "recipe": recipe, "job": tokens.job}
    return f"{sanitise(template.format(**values))}.{extension}"


def unique_names(names: Sequence[str]) -> list[str]:
    """The names in order, a later duplicate (case-insensitive) becoming ``<stem>_2.<ext>``, ``_3``, ...:
    deterministic for the same list."""
    taken: set[str] = set()
    out = []
    for name in names:
        stem, dot, ext = name.rpartition(".")
        candidate, n = name, 1
        while candidate.lower() in taken:
            n += 1
            candidate = f"{stem}_{n}{dot}{ext}"
        taken.add(candidate.lower())
        out.append(candidate)
    return out
