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


def _start_render(root: Path, dng: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-m", "tests.service.render_once", str(root), str(dng)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_every_output_format_is_byte_identical_across_processes(tmp_path: Path, synth_dir: Path) -> None:
    dng = synth_dir / "iq3s" / "frame_00.dng"
    procs = [_start_render(tmp_path / name, dng) for name in ("a", "b")]  # two fresh processes, side by side
    try:
        first, second = (_result(p) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(first) == len(RECIPES)
    assert first == second
