"""The benchmark's held-out shots: content specs -> :class:`Shot` (name, content, seed, CFA phase), and their
synthetic IQ3_S DNGs (cached, the ground truth beside each)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CAMERA = "IQ3_S"
SPACE = "srgb"
LEVELS = ("none", "low", "mid", "high")
CFA_CYCLE = ("RGGB", "BGGR", "GRBG", "GBRG")
DEAD_LEAVES_HELD_OUT = (900_000, 900_001)  # inside training/data.py's held-out seed range 900000..900015
PHOTO_SEED_BASE = 910_000  # noise seeds of photo shots (seed + photo number)


@dataclass(frozen=True)
class Shot:
    """One held-out shot: a name, the synth content spec, the seed and the CFA phase."""

    name: str
    content: str
    seed: int
    cfa: str


def held_out_shots(photos_dir: Path | str | None = None, notes: list[str] | None = None) -> list[str]:
    """Default content specs: the held-out photographs that exist in ``photos_dir`` + held-out dead leaves."""
    from lab.synth.unprocess import PHOTOS_HELD_OUT, photo_path

    specs = []
    for name in PHOTOS_HELD_OUT:
        try:
            photo_path(name, photos_dir)
        except ValueError:
            continue
        specs.append(f"photo:{name}")
    if len(specs) < len(PHOTOS_HELD_OUT) and notes is not None:
        notes.append(f"held-out photos found: {len(specs)} of {len(PHOTOS_HELD_OUT)} (photos dir {photos_dir})")
    return specs + [f"dead_leaves:{s}" for s in DEAD_LEAVES_HELD_OUT]


def parse_shots(specs: Sequence[str], cfa: str | None = None, notes: list[str] | None = None) -> list[Shot]:
    """Content specs -> shots. ``photo:NNN`` / ``skimage:NAME`` / a path, or ``dead_leaves[:SEED]``.

    The CFA phase is ``cfa`` for every shot, else it cycles through all four phases over the shots.
    """
    from lab.synth.unprocess import PHOTOS_HELD_OUT

    shots = []
    for i, spec in enumerate(specs):
        phase = cfa or CFA_CYCLE[i % len(CFA_CYCLE)]
        if spec.startswith("dead_leaves"):
            seed = int(spec.split(":", 1)[1]) if ":" in spec else DEAD_LEAVES_HELD_OUT[0]
            shots.append(Shot(f"dead_leaves_{seed}", "dead_leaves", seed, phase))
            if notes is not None and not 900_000 <= seed < 900_016:
                notes.append(f"dead_leaves seed {seed} is outside the held-out range 900000..900015")
            continue
        label = spec.split(":", 1)[1] if ":" in spec else Path(spec).stem
        digits = "".join(ch for ch in label if ch.isdigit())
        seed = PHOTO_SEED_BASE + (int(digits) if digits else i)
        shots.append(Shot(f"{spec.split(':', 1)[0] if ':' in spec else 'file'}_{label}", spec, seed, phase))
        if notes is not None and spec.startswith("photo:") and label not in PHOTOS_HELD_OUT:
            notes.append(f"{spec} is a training photograph, not held out")
    return shots


def synth_cached(cache: Path, shot: Shot, level: str, scale: float, photos_dir: Path | str | None) -> Path:
    """The DNG of ``shot`` at ``level`` (synthesised once into ``cache``); ground truth sits beside it."""
    from lab.synth.synth import synthesize_shot

    out = cache / f"{shot.name}_{shot.cfa}_s{scale:g}_{level}_seed{shot.seed}"
    dng = out / "frame_00.dng"
    if not (dng.exists() and (out / "ground_truth.tif").exists()):
        synthesize_shot(CAMERA, out, scale=scale, seed=shot.seed, noise=level, cfa=shot.cfa, content=shot.content,
                        space=SPACE, photos_dir=photos_dir)
    return dng
