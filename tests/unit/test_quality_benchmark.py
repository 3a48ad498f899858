"""Quality benchmark (`strata quality`): metrics against scikit-image, the guarded LibRaw path, a tiny run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile

from lab.quality import anchors, benchmark
from lab.quality import cli as quality_cli
from lab.quality import metrics as qmetrics
from lab.quality import report as qreport
from lab.synth.synth import synthesize_shot


def _smooth_pair(seed: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Two correlated images in [0, 1]: a smooth random field and a noisy version of it."""
    rng = np.random.default_rng(seed)
    base = rng.random(shape)
    for axis in (0, 1):  # a little spatial correlation, so SSIM is neither ~0 nor ~1
        base = (base + np.roll(base, 1, axis) + np.roll(base, -1, axis)) / 3
    other = np.clip(base + rng.normal(0, 0.05, shape), 0, 1)
    return base, other


@pytest.mark.parametrize("shape", [(64, 80, 3), (50, 41)])
def test_ssim_matches_scikit_image(shape: tuple[int, ...]) -> None:
    metrics = pytest.importorskip("skimage.metrics")
    a, b = _smooth_pair(0, shape)
    ours = qmetrics.ssim(a, b, border=0)
    ref = metrics.structural_similarity(a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                        data_range=1.0, channel_axis=-1 if len(shape) == 3 else None)
    assert 0.2 < ref < 0.95
    assert ours == pytest.approx(ref, abs=1e-9)


def test_ssim_and_psnr_of_identical_images() -> None:
    a, _ = _smooth_pair(1, (40, 40, 3))
    img = np.rint(a * 65535).astype(np.uint16)
    assert qmetrics.psnr(img, img) == math.inf
    assert qmetrics.ssim(img, img) == pytest.approx(1.0)
    shifted = np.full((40, 40, 3), 0.5)
    assert qmetrics.psnr(shifted, shifted + 0.1) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        qmetrics.psnr(img, img[:-1])


def test_summary_json_handles_infinite_psnr() -> None:
    rows = [{"level": "none", "method": "classical_v1", "psnr": math.inf, "ssim": 1.0, "seconds": 0.1},
            {"level": "none", "method": "libraw_ahd", "psnr": 40.0, "ssim": 0.9, "seconds": 0.1}]
    summary = qreport.summarise(rows, ["none"], ["classical_v1", "libraw_ahd"])
    assert summary["best_libraw"]["none"] == "libraw_ahd"
    assert summary["margins"]["none"]["classical_v1"]["vs_libraw_ahd"] == pytest.approx(160.0)
    json.dumps(qreport.json_safe({"rows": rows}), allow_nan=False)


def test_align_to_truth_finds_cropped_margins() -> None:
    truth, _ = _smooth_pair(2, (60, 70, 3))
    crop = truth[3:55, 2:66]
    image, ref, info = qmetrics.align_to_truth(crop, truth)
    assert info["offset"] == [3, 2] and not info["aligned"]
    np.testing.assert_array_equal(image, ref)
    image, ref, info = qmetrics.align_to_truth(truth, truth)
    assert info["aligned"] and ref.shape == truth.shape


def test_libraw_path_in_child_aligns_with_truth(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ3_S", tmp_path, scale=0.02, seed=900_000, noise="none", cfa="GBRG")
    truth = tifffile.imread(shot.ground_truth)
    with anchors.LibRawRunner(timeout_s=120) as runner:
        result, error = runner.call(anchors.libraw_render, str(shot.files[0]), "libraw_ahd")
        assert error is None, error
        image, seconds = result
        assert image.dtype == np.uint16 and image.shape == truth.shape and seconds > 0
        aligned, ref, info = qmetrics.align_to_truth(image, truth)
        assert info["aligned"]
        assert qmetrics.psnr(aligned, ref) > 25
        colour = qmetrics.colour_check(aligned, ref)
        assert colour["flat_pixels"] > 100 and colour["mean_abs_diff"] < benchmark.COLOUR_TOLERANCE
        # A crash in the child is reported, and the runner starts a fresh child for the next call.
        crashed, error = runner.call(os.abort)
        assert crashed is None and error is not None and "crash" in error
        again, error = runner.call(anchors.libraw_render, str(shot.files[0]), "libraw_dcb")
        assert error is None and again[0].shape == truth.shape


def test_tiny_benchmark_run_writes_json_and_crops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.json"
    rc = quality_cli.main(["--scale", "0.02", "--levels", "none,mid", "--content", "dead_leaves:900001",
                           "--device", "cpu",
                           "--methods", "classical_v1.strata,missing_model_v9.strata,libraw_ahd,libraw_ahd_fbdd_med3",
                           "--json", str(out), "--crops", str(tmp_path / "crops"), "--crop-size", "64", "--quiet"])
    assert rc == 0
    report = json.loads(out.read_text())
    for key in ("settings", "machine", "methods", "skipped", "rows", "summary", "alignment", "colour_check",
                "crops", "notes"):
        assert key in report
    assert report["methods"] == ["classical_v1", "libraw_ahd", "libraw_ahd_fbdd_med3"]
    assert "missing_model_v9" in report["skipped"]
    assert len(report["rows"]) == 2 * 3 and all(r["psnr"] > 20 for r in report["rows"])
    summary = report["summary"]
    assert set(summary["mean"]) == {"none", "mid"}
    assert summary["best_libraw"]["none"] in ("libraw_ahd", "libraw_ahd_fbdd_med3")
    assert set(summary["margins"]["mid"]["classical_v1"]) == {"vs_libraw_ahd", "vs_best_libraw"}
    assert report["settings"]["shots"][0]["cfa"] == "RGGB"
    assert sorted(Path(p).name for p in report["crops"].values()) == [
        "crop_mid_dead_leaves_900001.png", "crop_none_dead_leaves_900001.png"]
    assert "PSNR" in capsys.readouterr().out


def test_the_artefact_benchmark_scores_a_test_scene_at_every_phase(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--artefacts renders each content at the four CFA phases and adds its artefact measure (classical here)."""
    out = tmp_path / "a.json"
    rc = quality_cli.main(["--artefacts", "--scale", "0.02", "--levels", "none", "--content", "pattern:checker",
                           "--device", "cpu", "--methods", "classical_v1.strata,libraw_ahd", "--json", str(out),
                           "--quiet"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert sorted(r["cfa"] for r in report["rows"] if r["method"] == "classical_v1") == sorted(
        ("RGGB", "BGGR", "GRBG", "GBRG"))
    assert all(r["chroma_err"] >= 0 for r in report["rows"])
    (entry,) = [e for e in report["artefacts"] if e["method"] == "libraw_ahd"]
    assert entry["content"] == "pattern:checker" and len(entry["phases"]) == 4 and entry["chroma_err"] < 5
    assert "chroma" in capsys.readouterr().out


def test_auto_ensemble_renders_as_the_best_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PACKAGE@auto`` (a default method) renders with the orientations the best tier picks for the shot: two
    on a clean shot, one at mid noise; ``@N`` forces N."""
    from lab.quality import strata
    from services.pipeline import render
    from services.pipeline.shot import shot_render_params

    assert strata.split_ensemble("strata_jdd_v2.strata@auto") == ("strata_jdd_v2.strata", strata.AUTO)
    assert strata.package_label("strata_jdd_v2.strata@auto") == "strata_jdd_v2@auto"
    assert strata.split_ensemble("a@b.strata") == ("a@b.strata", 1)
    seen: list[int] = []
    monkeypatch.setattr(render, "render_mosaic", lambda mosaic, params, device: seen.append(params.orientations))
    for level in ("none", "mid"):
        shot = synthesize_shot("IQ3_S", tmp_path / level, scale=0.02, seed=900_000, noise=level, cfa="RGGB")
        meta, mosaic, _ = strata.decode(shot.files[0], tmp_path)
        for method in ("strata_jdd_v2.strata@auto", "strata_jdd_v2.strata@4"):
            strata.render_strata(meta, mosaic, method, "cpu")
        seen.append(shot_render_params(meta, mosaic, tier="best").orientations)  # the service's own choice
        seen.append(shot_render_params(meta, mosaic, tier="fast").orientations)
    assert seen == [2, 4, 2, 1, 1, 4, 1, 1]


@pytest.mark.parametrize(("argv", "says"), [
    (["--levels", "none,bogus"], "unknown noise level 'bogus'"),
    (["--content", "photo:999", "--photos-dir", "/nonexistent"], "--content photo:999: photograph '999' not found"),
    (["--content", "dead_leaves:x"], "dead_leaves seed 'x' is not a whole number"),
    (["--content", "/nonexistent/image.png"], "no image file /nonexistent/image.png"),
])
def test_bad_input_is_a_usage_error_before_anything_runs(argv: list[str], says: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from lab.quality.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "says"), [
    (["--noise", "-1"], "--noise and --max-shift must be >= 0"),
    (["--content", "dead_leaves:5"], "dead_leaves takes no seed here"),
    (["--content", "photo:999", "--photos", "/nonexistent"], "--content photo:999: photograph '999' not found"),
])
def test_the_stack_benchmark_refuses_bad_input_before_it_runs(argv: list[str], says: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from lab.quality.stack_bench import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(("module", "argv", "says"), [
    ("lab.bench.enhance", ["--device", "cuda:7"], "argument --device: cuda:7:"),
    ("lab.bench.pipeline", ["--devices", "cpu,cuda:7"], "argument --devices: cuda:7:"),
    ("lab.quality.stack_bench", ["--device", "tpu"], "argument --device: "),
    ("lab.bench.preview", ["--scale", "-1"], "argument --scale: must be a finite number above 0, got -1"),
    ("lab.bench.service", ["--scale", "x"], "argument --scale: 'x' is not a number"),
])
def test_the_benchmarks_refuse_a_device_or_scale_that_cannot_work(module: str, argv: list[str], says: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err
