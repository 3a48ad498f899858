"""The training script's smoke run writes a loadable package that is never a default; data recipe checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.pipeline.models import load_package
from services.pipeline.models.package import read_package
from training import data
from training.train import main

PHOTOS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "photos"
needs_photos = pytest.mark.skipif(not PHOTOS.is_dir(), reason=f"training photographs not at {PHOTOS}")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training photographs when this checkout sits beside ../shared, else a stand-in directory of PNGs
    (dead-leaves images under training and held-out names), so the training runs also run in a lone clone."""
    if PHOTOS.is_dir():
        return PHOTOS
    from PIL import Image

    out = tmp_path_factory.mktemp("photos")
    names = ["001.png", "002.png", "003.png", *sorted(data.HELD_OUT_PHOTOS)[:2]]
    for i, name in enumerate(names):
        Image.fromarray(data.dead_leaves(800_000 + i, 160).permute(1, 2, 0).numpy()).save(out / name)
    return out


def test_smoke_training_writes_a_loadable_smoke_package(tmp_path: Path, photos: Path) -> None:
    main(["--smoke", "--photos", str(photos), "--out", str(tmp_path)])
    path = tmp_path / "strata_jdd_v1-smoke.strata"
    enh = load_package(path, camera="IQ2_XS")
    assert enh.manifest.is_smoke and enh.manifest.training["steps"] == 20
    out = enh.enhance(torch.rand(1, 1, 40, 44), "BGGR", [1e-3] * 3, [1e-5] * 3)
    assert out.shape == (1, 3, 40, 44) and torch.isfinite(out).all()
    metrics = json.loads((tmp_path / "strata_jdd_v1-seed0-smoke.json").read_text())
    assert set(metrics["metrics"]["float32"]) == set(data.NOISE_LEVELS)
    assert (tmp_path / "strata_jdd_v1-seed0-smoke.log").exists()


@needs_photos
def test_held_out_photos_never_train() -> None:
    train = {p.name for p in data.photo_paths(PHOTOS, held_out=False)}
    held = {p.name for p in data.photo_paths(PHOTOS, held_out=True)}
    assert held == set(data.HELD_OUT_PHOTOS) and not train & held and len(train) == 32


def test_unprocess_contract() -> None:
    """White-balanced input over clean target: gains cancel, saturation clips at the gain, noise is reported
    in the white-balanced model the renderer uses."""
    gen = torch.Generator().manual_seed(0)
    srgb = torch.full((1, 3, 8, 8), 0.5)
    srgb[..., :4] = 1.0
    gains = torch.tensor([[2.0, 1.0, 1.5]])
    mix = torch.ones(1, len(data.XYZ_TO_CAMS))
    b = data.unprocess(srgb, cfa="GBRG", margin=0, gen=gen, shot=torch.zeros(1), read=torch.zeros(1),
                       exposure=torch.tensor([3.0]), gains=gains, mix=mix, report_jitter=False)
    cam = data.apply_matrix_batch(data.srgb_decode(srgb) * 3.0, data.rgb_to_cam(mix)).clamp(min=0)
    assert torch.allclose(b.mosaic, data.mosaic_of(torch.minimum(cam, gains.view(1, 3, 1, 1)), "GBRG"), atol=1e-6)
    assert torch.allclose(b.target, torch.minimum(cam, gains.view(1, 3, 1, 1)))
    assert torch.allclose(data.rgb_to_cam(mix).sum(dim=2), torch.ones(1, 3))
    noisy = data.unprocess(srgb, cfa="RGGB", margin=2, gen=gen, shot=torch.tensor([1e-2]),
                           read=torch.tensor([1e-4]), exposure=torch.ones(1), gains=gains, mix=mix,
                           report_jitter=False)
    assert noisy.target.shape == (1, 3, 4, 4)
    assert torch.allclose(noisy.shot, 1e-2 * gains) and torch.allclose(noisy.read, 1e-4 * gains**2)


def test_dead_leaves_is_deterministic() -> None:
    a, b = data.dead_leaves(900_000, 48), data.dead_leaves(900_000, 48)
    assert a.shape == (3, 48, 48) and a.dtype == torch.uint8 and torch.equal(a, b)
    assert not torch.equal(a, data.dead_leaves(900_001, 48))


def test_a_run_stopped_at_a_checkpoint_resumes_to_the_end(tmp_path: Path, photos: Path) -> None:
    """--stop-after saves the run part-way (no package), --resume finishes it (recipe v2, the v2 smoke run)."""
    ckpt = tmp_path / "ckpt.pt"
    common = ["--package", "v2", "--smoke", "--steps", "6", "--photos", str(photos), "--out", str(tmp_path)]
    main([*common, "--stop-after", "0", "--checkpoint", str(ckpt)])
    assert ckpt.exists() and not (tmp_path / "strata_jdd_v1-smoke.strata").exists()
    assert torch.load(ckpt, weights_only=False)["step"] == 1
    main([*common, "--resume", str(ckpt)])
    metrics = json.loads((tmp_path / "strata_jdd_v2-seed0-smoke.json").read_text())
    assert metrics["finished"] and metrics["steps"] == 6 and metrics["data"]["content"]["patterns"] == 4
    assert load_package(tmp_path / "strata_jdd_v1-smoke.strata").manifest.is_smoke


def test_pattern_images_are_deterministic_and_not_flat() -> None:
    for seed in range(10):
        a = data.pattern_image(seed, 48)
        assert a.shape == (3, 48, 48) and torch.equal(a, data.pattern_image(seed, 48))
        assert a.float().std() > 5  # every kind draws a visible pattern


def test_recipe_v1_draws_no_scene_augmentation() -> None:
    """v1 runs repeat exactly: its scene variety is the identity and consumes no random numbers."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 16, 16)
    assert torch.equal(data.scene_variety(x, data.RECIPES["v1"], gen), x)
    assert torch.equal(torch.rand(1, generator=gen), torch.rand(1, generator=torch.Generator().manual_seed(1)))
    y = data.scene_variety(x, data.RECIPES["v2"], torch.Generator().manual_seed(0))
    assert y.shape == x.shape and float(y.min()) >= 0 and float(y.max()) <= 1


def test_the_soft_recipe_makes_a_share_of_scenes_neutral() -> None:
    """Recipe ``soft`` (the best package's fine-tuning): gray_share 1 leaves every image luma only, in range."""
    recipe = data.Recipe("gray", data.RECIPES["soft"].weights, gray_share=1.0)
    x = torch.rand(3, 3, 16, 16)
    y = data.scene_variety(x, recipe, torch.Generator().manual_seed(0))
    assert torch.allclose(y[:, 0], y[:, 1]) and torch.allclose(y[:, 1], y[:, 2])
    assert float(y.min()) >= 0 and float(y.max()) <= 1
    assert data.RECIPES["soft"].weights["skimage"] == 0  # scikit-image's photographs stay an unseen source


def test_init_fine_tunes_from_a_package_and_refuses_another_config(tmp_path: Path, photos: Path) -> None:
    """--init starts a run from a package's weights (the fine-tuning that made strata_jdd_v2 2.1.0); a package
    of another config is refused before any training."""
    first = tmp_path / "first"
    main(["--package", "v2", "--smoke", "--steps", "2", "--photos", str(photos), "--out", str(first)])
    start = first / "strata_jdd_v1-smoke.strata"
    out = tmp_path / "ft"
    main(["--package", "v2", "--smoke", "--steps", "2", "--recipe", "soft", "--init", str(start), "--lr", "0",
          "--photos", str(photos), "--out", str(out)])
    assert "initialised from strata_jdd_v1-smoke.strata" in (out / "strata_jdd_v2-seed0-soft-ft-smoke.log").read_text()
    before, after = read_package(start).weights, read_package(out / "strata_jdd_v1-smoke.strata").weights
    assert before and after and all(torch.equal(before[k], after[k]) for k in before)  # lr 0: the start, unchanged
    assert json.loads((out / "strata_jdd_v2-seed0-soft-ft-smoke.json").read_text())["finished"]
    with pytest.raises(SystemExit, match="does not match"):
        main(["--package", "v2", "--smoke", "--steps", "2", "--init", "strata_jdd_v2.strata", "--photos",
              str(photos), "--out", str(tmp_path / "x")])


def test_stack_frames_share_one_square_of_the_scene() -> None:
    gen = torch.Generator().manual_seed(3)
    scenes = data.dead_leaves(900_123, 41)[None].float().repeat(2, 1, 1, 1) / 255.0  # (2, 3, 41, 41): L = 40
    ones = torch.ones(2)
    stacks = data.stack_of(scenes, 4, 4, gen, shot=ones * 1e-3, read=ones * 1e-5, exposure=ones,
                           gains=torch.tensor([[2.0, 1.0, 1.5]] * 2), mix=torch.ones(2, len(data.XYZ_TO_CAMS)),
                           report_jitter=False)
    assert stacks.raw.mosaic.shape == (8, 1, 40, 40) and stacks.target.shape == (2, 3, 31, 31)
    assert sorted(stacks.offsets) == sorted(data.STACK_OFFSETS) and stacks.offsets[0] == (0, 0)
    targets = data.aligned(stacks.raw.target, stacks)  # every frame's clean target over the shared square
    assert torch.equal(targets, targets[:, :1].expand_as(targets))
    assert not torch.equal(stacks.raw.mosaic[0], stacks.raw.mosaic[1])  # moved, and its own noise
    told = data.stack_told(4)
    assert told == 0.25 and torch.allclose(stacks.raw.shot[:4], torch.tensor([2.0, 1.0, 1.5]) * 1e-3 * told)


def test_sub_pixel_stacks_warp_back_with_the_service_warp() -> None:
    """``--subpixel`` stacks: frames moved by fractions of a pixel too (a band-limited shift of the scene), each
    render brought back by what the stack merge's Lanczos-5 warp computes, on a square trimmed by its taps."""
    from services.pipeline.ops.align import _warp_lanczos

    frames = torch.rand(2, 3, 3, 20, 24, generator=torch.Generator().manual_seed(0))
    rows, cols = [0.0, 0.3, 0.77], [0.0, 0.5, 0.123]
    moved = data.lanczos_shift(data.lanczos_shift(frames, rows, -2), cols, -1)
    for i, (fy, fx) in enumerate(zip(rows, cols, strict=True)):
        flow = torch.tensor([-fy, -fx]).view(2, 1, 1).expand(2, 20, 24)
        warped = _warp_lanczos(frames[:, i].reshape(-1, 20, 24), flow, 5, fused=False).view(2, 3, 20, 24)
        torch.testing.assert_close(moved[:, i], warped, atol=3e-6, rtol=0)
    yy, xx = torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij")
    wave = lambda y, x: 0.5 + 0.2 * torch.sin(2 * torch.pi * (0.07 * y + 0.11 * x))  # noqa: E731
    shifted = data.fourier_shift(wave(yy, xx)[None, None], 0.3, -0.45)[0, 0]
    assert float((shifted - wave(yy + 0.3, xx - 0.45))[16:-16, 16:-16].abs().max()) < 0.005

    gen = torch.Generator().manual_seed(3)
    scenes = data.dead_leaves(900_123, 41)[None].float().repeat(2, 1, 1, 1) / 255.0
    scenes = torch.nn.functional.avg_pool2d(scenes, 3, stride=1, padding=1, count_include_pad=False)  # softer
    ones = torch.ones(2)
    stacks = data.stack_of(scenes, 4, 4, gen, shot=ones * 1e-3, read=ones * 1e-5, exposure=ones,
                           gains=torch.tensor([[2.0, 1.0, 1.5]] * 2), mix=torch.ones(2, len(data.XYZ_TO_CAMS)),
                           report_jitter=False, subpixel=True)
    t = data.SUBPIXEL_TRIM
    assert stacks.target.shape == (2, 3, 31 - 2 * t, 31 - 2 * t)
    assert stacks.fractions is not None and stacks.fractions[0] == (0.0, 0.0)
    assert all(0.0 <= f < 1.0 for pair in stacks.fractions[1:] for f in pair) and len(set(stacks.fractions)) == 4
    targets = data.aligned(stacks.raw.target, stacks)  # every frame's clean target, brought back to frame 0's grid
    assert float((targets - targets[:, :1]).abs().mean()) < 0.005


def test_the_frames_package_trains_on_stacks_and_is_scored_on_them(tmp_path: Path, photos: Path) -> None:
    first = tmp_path / "init"
    main(["--package", "frames", "--smoke", "--steps", "2", "--photos", str(photos), "--out", str(first)])
    start = first / "strata_jdd_v1-smoke.strata"
    out = tmp_path / "ft"
    main(["--package", "frames", "--smoke", "--steps", "2", "--init", str(start), "--lr", "0", "--photos",
          str(photos), "--out", str(out)])
    stacks = json.loads((out / "strata_jdd_v2_frames-seed0-v2-ft-smoke.json").read_text())["held_out_stacks_psnr"]
    assert sorted(stacks) == ["4 frames", "8 frames"]
    for v in stacks.values():  # at lr 0 the model is its init, scored on the same stacks
        assert v["model"] == v["init"] and v["model"] > 10.0


def test_training_runs_without_the_service_dependencies(tmp_path: Path, photos: Path) -> None:
    # The GPU machine that trains has torch and scikit-image, not the service's pydantic: a stack smoke run there
    # once died importing services.config. Block pydantic in a fresh interpreter and run one.
    script = ("import runpy, sys\n"
              "sys.modules['pydantic'] = None\nsys.modules['pydantic_settings'] = None\n"
              "sys.argv = ['training.train', *sys.argv[1:]]\n"
              "runpy.run_module('training.train', run_name='__main__')\n")
    args = ["--package", "frames", "--smoke", "--steps", "1", "--photos", str(photos), "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "strata_jdd_v1-smoke.strata").is_file()
