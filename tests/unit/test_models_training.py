"""The training script's smoke run writes a loadable package that is never a default; data recipe checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.pipeline.models import load_package
from training import data
from training.train import main

PHOTOS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "photos"
needs_photos = pytest.mark.skipif(not PHOTOS.is_dir(), reason=f"training photographs not at {PHOTOS}")


@needs_photos
def test_smoke_training_writes_a_loadable_smoke_package(tmp_path: Path) -> None:
    main(["--smoke", "--photos", str(PHOTOS), "--out", str(tmp_path)])
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
