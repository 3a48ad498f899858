"""Outputs are byte-identical across processes: the same shot rendered in two fresh processes (as after a
coordinator restart) gives the same sha256 for every output format (TIFF 16/8-bit, deflate and zstd, sRGB,
Adobe RGB and ProPhoto ICC, JPEG, JPEG proof, PNG)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.service.render_once import RECIPES


def _render(root: Path, dng: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "tests.service.render_once", str(root), str(dng)], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_every_output_format_is_byte_identical_across_processes(tmp_path: Path, synth_dir: Path) -> None:
    dng = synth_dir / "iq3s" / "frame_00.dng"
    first = _render(tmp_path / "a", dng)
    second = _render(tmp_path / "b", dng)
    assert len(first) == len(RECIPES)
    assert first == second
