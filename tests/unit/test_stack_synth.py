"""Synthetic stacks: shifts, the moving object and its mask, the pixel-shift pattern, files LibRaw reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rawpy
from PIL import Image

from lab.synth.stack_synth import PIXEL_SHIFT_PATTERN, synthesize_stack


def test_random_shifts_and_files(tmp_path: Path) -> None:
    shot = synthesize_stack(tmp_path, frames=3, scale=0.02, seed=1, max_shift=1.5)
    assert [f.name for f in shot.files] == ["frame_00.dng", "frame_01.dng", "frame_02.dng"]
    assert shot.shifts[0] == (0.0, 0.0) and all(abs(v) <= 1.5 for s in shot.shifts for v in s)
    assert not shot.motion_mask.any() and shot.camera_rgb.shape == (146, 138, 3)
    with rawpy.imread(str(shot.files[1])) as raw:
        assert raw.raw_image.shape == (146, 138)


def _raw(path: Path) -> np.ndarray:
    with rawpy.imread(str(path)) as raw:
        return raw.raw_image.astype(np.int64)


def test_moving_object_changes_the_frames_only_inside_the_mask(tmp_path: Path) -> None:
    still = synthesize_stack(tmp_path / "a", frames=3, scale=0.02, seed=2, noise=0.0)
    moving = synthesize_stack(tmp_path / "b", frames=3, scale=0.02, seed=2, noise=0.0, moving_object=True)
    mask = moving.motion_mask
    assert 0 < mask.mean() < 0.3 and still.shifts == moving.shifts
    changed = [_raw(a) != _raw(b) for a, b in zip(still.files, moving.files, strict=True)]
    assert all(c.any() and not (c & ~mask).any() for c in changed)  # the disc, and nothing outside the mask
    assert (changed[2] & ~changed[1]).sum() > 0.5 * changed[1].sum()  # the last frame has it elsewhere


def test_a_walking_object_moves_in_every_frame_and_the_mask_holds_each_place(tmp_path: Path) -> None:
    still = synthesize_stack(tmp_path / "a", frames=4, scale=0.02, seed=2, noise=0.0)
    moved = synthesize_stack(tmp_path / "b", frames=4, scale=0.02, seed=2, noise=0.0, moving_object=True)
    walker = synthesize_stack(tmp_path / "c", frames=4, scale=0.02, seed=2, noise=0.0, moving_object=True,
                              walking=True)
    assert walker.shifts == still.shifts and (walker.motion_mask >= moved.motion_mask).all()
    assert walker.motion_mask.sum() > moved.motion_mask.sum()  # the places between as well
    disc = [_raw(a) != _raw(b) for a, b in zip(still.files, walker.files, strict=True)]  # where each frame has it
    assert all(d.any() and not (d & ~walker.motion_mask).any() for d in disc)
    assert (disc[0] == (_raw(still.files[0]) != _raw(moved.files[0]))).all()  # the reference as before
    for k in (1, 2, 3):  # each frame has it somewhere the one before had not
        assert (disc[k] & ~disc[k - 1]).sum() > 0.2 * disc[k].sum()
    last = _raw(moved.files[3]) != _raw(still.files[3])
    assert (disc[3] == last).all()  # the last frame's place is the one-frame move's


def test_pixel_shift_pattern(tmp_path: Path) -> None:
    shot = synthesize_stack(tmp_path, frames=4, scale=0.02, seed=3, noise=0.0, pixel_shift=True)
    assert shot.shifts == list(PIXEL_SHIFT_PATTERN)
    ref, diagonal = _raw(shot.files[0]), _raw(shot.files[2])
    # Frame 2 moved by (1, 1): its site (y+1, x+1) saw the scene point of reference site (y, x), and on RGGB
    # the green sites map onto green sites, so those samples agree (noise-free, up to rounding).
    assert np.abs(ref[0:-1:2, 1:-1:2] - diagonal[1::2, 2::2]).max() <= 1
    with pytest.raises(ValueError, match="4 frames"):
        synthesize_stack(tmp_path / "x", frames=8, scale=0.02, pixel_shift=True)


def _cli_synth(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "synth", "--camera", "IQ2_XS", "--out", str(out),
                           "--scale", "0.02", *args], capture_output=True, text=True)


def test_strata_synth_writes_moving_object_and_pixel_shift_stacks(tmp_path: Path) -> None:
    done = _cli_synth(tmp_path / "m", "--frames", "3", "--moving-object", "--cfa", "GBRG", "--noise", "mid")
    assert done.returncode == 0, done.stderr
    assert [Path(x).name for x in done.stdout.split()] == ["frame_00.dng", "frame_01.dng", "frame_02.dng"]
    mask = np.asarray(Image.open(tmp_path / "m" / "motion_mask.png"))
    assert mask.shape == (146, 138) and 0 < (mask == 255).sum() < mask.size and set(np.unique(mask)) == {0, 255}
    with rawpy.imread(str(tmp_path / "m" / "frame_00.dng")) as raw:
        assert raw.color_desc.decode()[:3] == "RGB" and raw.raw_image.shape == (146, 138)

    done = _cli_synth(tmp_path / "p", "--pixel-shift", "--max-shift", "0")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 4 and (tmp_path / "p" / "ground_truth.tif").exists()


def test_strata_synth_refuses_stack_scenes_it_cannot_make(tmp_path: Path) -> None:
    done = _cli_synth(tmp_path / "x", "--pixel-shift", "--frames", "8")
    assert done.returncode == 2 and "4 frames" in done.stderr
    done = _cli_synth(tmp_path / "y", "--moving-object", "--space", "prophoto")
    assert done.returncode == 2 and "sRGB ground truth only" in done.stderr
