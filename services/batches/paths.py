"""Server-side imports: RAW files under the configured import root, nothing outside it."""

from __future__ import annotations

from pathlib import Path

from services.errors import BadInput

RAW_SUFFIXES = frozenset({".dng", ".iiq", ".3fr", ".fff", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".pef"})


def under_root(root: Path | None, path: str) -> Path:
    """``path`` (absolute, or relative to the root) resolved through symlinks and ``..``; ``BadInput`` unless it
    exists inside ``root``."""
    if root is None:
        raise BadInput("server-side paths are off: no import root is configured (STRATA_IMPORT_ROOT)")
    base = root.resolve()
    candidate = Path(path)
    shown = _shown(candidate, base)  # never the server's own folders (found from outside: the root's full path)
    try:
        resolved = (candidate if candidate.is_absolute() else base / candidate).resolve()
        exists = resolved.exists()
    except (ValueError, OSError) as exc:  # a NUL, a name too long: 500s found from outside
        raise BadInput(f"path {shown!r} cannot be used: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    if resolved != base and base not in resolved.parents:
        raise BadInput(f"path {shown!r} is outside the import root")
    if not exists:
        raise BadInput(f"path {shown!r} does not exist")
    return resolved


def _shown(path: Path, base: Path) -> str:
    """``path`` as a refusal names it: relative to the import root where it lies under it."""
    try:
        return path.relative_to(base).as_posix() if path.is_absolute() else str(path)
    except ValueError:
        return str(path)


def raw_files(root: Path | None, paths: list[str]) -> list[Path]:
    """Every RAW file the paths name: files as given, folders walked (sorted, recursively, hidden entries
    skipped); each file's real location must be under the root too (a symlink inside a folder may not lead out).
    Duplicates are dropped."""
    found: list[Path] = []
    for p in paths:
        resolved = under_root(root, p)
        files = [resolved] if resolved.is_file() else sorted(
            f for f in resolved.rglob("*") if f.is_file() and not any(part.startswith(".") for part in
                                                                       f.relative_to(resolved).parts))
        for f in files:
            real = under_root(root, str(f))
            if real.suffix.lower() in RAW_SUFFIXES and real not in found:
                found.append(real)
    return found
