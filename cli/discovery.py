"""Which files `strata submit` / `strata batch create` send, and how they group into shots.

Folders are searched recursively for RAW files by extension (case-insensitive); dotfiles and partial copies are
skipped. Each file is one shot, unless ``--stack`` makes all of them one stack, or ``--stacks-by-name`` groups
files of one folder named ``<base>_<NN>.<ext>`` or ``<base>-<NN>.<ext>`` whose frame numbers run consecutively,
2 to 16 of them, into one stack each (a longer or a broken run stays single shots).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RAW_EXTENSIONS = frozenset({".dng", ".iiq", ".3fr", ".fff", ".nef", ".cr2", ".cr3", ".arw", ".raf", ".orf",
                            ".rw2", ".pef", ".srw"})
PARTIAL_SUFFIXES = (".part", ".tmp", ".crdownload", ".partial")
MIN_STACK, MAX_STACK = 2, 16
_FRAME_NAME = re.compile(r"^(?P<base>.+?)(?P<sep>[_-])(?P<num>\d{2,6})$")


@dataclass(frozen=True)
class Shot:
    """One job to send: its frames in order, and the folder its outputs go to relative to ``--out``."""

    files: tuple[Path, ...]
    rel_dir: Path = field(default=Path("."))

    @property
    def name(self) -> str:
        return self.files[0].name if len(self.files) == 1 else f"{self.files[0].name} (+{len(self.files) - 1})"


def is_candidate(path: Path) -> bool:
    """A RAW file by extension that is neither hidden nor a partial copy (``.x``, ``~x``, ``x.part``, ``x.tmp``)."""
    name = path.name
    if name.startswith((".", "~")) or name.lower().endswith(PARTIAL_SUFFIXES):
        return False
    return path.suffix.lower() in RAW_EXTENSIONS


def find_raw_files(root: Path) -> list[Path]:
    """RAW files under ``root`` (recursively, sorted, hidden folders skipped); ``root`` itself if it is a file."""
    if root.is_file():
        return [root]
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts[:-1]):
            continue
        if path.is_file() and is_candidate(path):
            found.append(path)
    return found


def discover(inputs: list[Path]) -> list[tuple[Path, Path]]:
    """Every RAW file of ``inputs`` (files and folders) with its folder relative to the input it came from
    (a file given directly: ``.``); each file once, in the order given."""
    seen: set[Path] = set()
    out: list[tuple[Path, Path]] = []
    for item in inputs:
        for path in find_raw_files(item):
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            rel = path.parent.relative_to(item) if item.is_dir() else Path(".")
            out.append((path, rel))
    return out


def _frame_key(path: Path) -> tuple[str, str, str, int] | None:
    match = _FRAME_NAME.match(path.stem)
    if not match:
        return None
    return match["base"], match["sep"], path.suffix.lower(), int(match["num"])


def _runs(numbered: list[tuple[int, Path]]) -> list[list[Path]]:
    """Split frames sorted by number into runs of consecutive numbers."""
    runs: list[list[Path]] = []
    last: int | None = None
    for num, path in sorted(numbered):
        if last is not None and num == last + 1:
            runs[-1].append(path)
        else:
            runs.append([path])
        last = num
    return runs


def group_by_name(files: list[tuple[Path, Path]]) -> list[Shot]:
    """Stacks by the naming rule (module doc); every other file a single shot. Shots keep the order of their
    first file."""
    families: dict[tuple[Path, str, str, str], list[tuple[int, Path]]] = {}
    rel_of = {path: rel for path, rel in files}
    for path, _ in files:
        key = _frame_key(path)
        if key is not None:
            families.setdefault((path.parent, key[0], key[1], key[2]), []).append((key[3], path))
    first_of: dict[Path, tuple[Path, ...]] = {}
    for numbered in families.values():
        for run in _runs(numbered):
            if MIN_STACK <= len(run) <= MAX_STACK:
                first_of[run[0]] = tuple(run)
    in_stack = {p for run in first_of.values() for p in run}
    shots = []
    for path, rel in files:
        if path in first_of:
            shots.append(Shot(first_of[path], rel_of[path]))
        elif path not in in_stack:
            shots.append(Shot((path,), rel))
    return shots


def plan_shots(inputs: list[Path], *, stack: bool = False, stacks_by_name: bool = False) -> list[Shot]:
    """The shots to send for ``inputs``: one per file; all in one with ``stack``; named runs with
    ``stacks_by_name``."""
    files = discover(inputs)
    if not files:
        return []
    if stack:
        return [Shot(tuple(p for p, _ in files), files[0][1])]
    if stacks_by_name:
        return group_by_name(files)
    return [Shot((path,), rel) for path, rel in files]


__all__ = ["MAX_STACK", "MIN_STACK", "RAW_EXTENSIONS", "Shot", "discover", "find_raw_files", "group_by_name",
           "is_candidate", "plan_shots"]
