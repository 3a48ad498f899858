"""Model packages: manifest validation, write/read round trip, checksum, mismatch errors, registry defaults."""

from __future__ import annotations

import math
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from services.pipeline.models import ModelMismatch, ModelPackageError, halo_rows, registry
from services.pipeline.models.jdd import JDDNet, jdd_manifest, jdd_receptive_field
from services.pipeline.models.manifest import Manifest
from services.pipeline.models.package import load_package, read_package, write_package
from services.raw.meta import snr_db
from training import packages as training_packages
from training.packages import classical_manifest

CONFIG = {"width": 8, "dilations": [1, 2]}


def _net(config: dict = CONFIG, seed: int = 0) -> JDDNet:
    torch.manual_seed(seed)
    net = JDDNet(config["width"], config["dilations"])
    torch.nn.init.normal_(net.tail.weight, std=0.05)  # the real init is zero (= bilinear); make it do something
    return net


def _write_jdd(path: Path, cameras: tuple[str, ...] = ("*",), config: dict = CONFIG, smoke: bool = False) -> Path:
    net = _net(config)
    write_package(path, jdd_manifest(path.stem.replace(".", "_"), cameras, config, {"smoke": smoke}),
                  net.state_dict())
    return path


def _mosaic(h: int = 64, w: int = 72, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 1, h, w, generator=g) * 1.1


def test_manifest_round_trip_and_halo() -> None:
    m = jdd_manifest("pkg", ("IQ3_S",), CONFIG, {"seed": 0})
    assert Manifest.from_dict(m.to_dict()) == m
    assert m.receptive_field == jdd_receptive_field(CONFIG) == 2 * (2 + 2 * 3) + 1
    assert m.serves("iq3_s") and not m.serves("IQ2_XS")
    assert halo_rows(4, 2) == 6 and halo_rows(17, 2) == 20 and m.halo_rows(2) == 20


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Bad Name"}, "name must be"),
        ({"receptive_field": -1}, "receptive_field must be"),
        ({"dtype": "float64"}, "dtype must be"),
        ({"input": "srgb"}, "input must be"),
        ({"cameras": []}, "cameras must be"),
        ({"files": {"weights": "../w.safetensors"}, "sha256": {"weights": "0" * 64}}, "plain file name"),
        ({"files": {"weights": "w.safetensors"}, "sha256": {"weights": "xyz"}}, "64 lower-case hex"),
        ({"format": 2}, "format 2 is not supported"),
        ({"colour": "yes"}, "unknown keys"),
    ],
)
def test_manifest_rejects_bad_fields(change: dict, message: str) -> None:
    d = {**classical_manifest().to_dict(), **change}
    with pytest.raises(ModelPackageError, match=message):
        Manifest.from_dict(d)


def test_manifest_requires_keys() -> None:
    d = classical_manifest().to_dict()
    del d["receptive_field"]
    with pytest.raises(ModelPackageError, match="misses required keys"):
        Manifest.from_dict(d)


def test_declared_receptive_field_must_match_architecture(tmp_path: Path) -> None:
    m = Manifest.from_dict({**jdd_manifest("pkg", ("*",), CONFIG, {}).to_dict(), "receptive_field": 3})
    with pytest.raises(ModelPackageError, match="declares receptive_field 3"):
        write_package(tmp_path / "pkg.strata", m, _net().state_dict())


def test_round_trip_gives_same_outputs(tmp_path: Path) -> None:
    net = _net()
    path = tmp_path / "rt.strata"
    written = write_package(path, jdd_manifest("rt", ("*",), CONFIG, {}), net.state_dict())
    assert written.files == {"weights": "weights.safetensors"} and len(written.sha256["weights"]) == 64
    enh = load_package(path)
    x = _mosaic()
    shot, read = torch.tensor([2e-3, 1e-3, 1.5e-3]), torch.tensor([4e-6, 1e-6, 2e-6])
    from services.pipeline.models.jdd import JDDEnhancer

    direct = JDDEnhancer(written, net, torch.device("cpu"), torch.float32).enhance(x, "RGGB", shot, read)
    assert torch.equal(enh.enhance(x, "RGGB", shot, read), direct)
    again = tmp_path / "again.strata"
    write_package(again, jdd_manifest("rt", ("*",), CONFIG, {}), enh.net.state_dict())  # type: ignore[attr-defined]
    assert again.read_bytes() == path.read_bytes()  # deterministic package bytes


def test_directory_package_and_checksum_mismatch(tmp_path: Path) -> None:
    path = _write_jdd(tmp_path / "pkg.strata")
    folder = tmp_path / "pkgdir.strata"
    with zipfile.ZipFile(path) as zf:
        zf.extractall(folder)
    assert read_package(folder).manifest.name == "pkg"
    blob = bytearray((folder / "weights.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (folder / "weights.safetensors").write_bytes(bytes(blob))
    with pytest.raises(ModelPackageError, match="is corrupt: sha256 of weights.safetensors"):
        load_package(folder)


def test_wrong_camera_and_architecture(tmp_path: Path) -> None:
    path = _write_jdd(tmp_path / "iq3s_denoise_v2.strata", cameras=("IQ3_S",))
    assert load_package(path, camera="IQ3_S").manifest.cameras == ("IQ3_S",)
    with pytest.raises(ModelMismatch) as err:
        load_package(path, camera="IQ2_XS")
    assert str(err.value) == ("model architecture mismatch: package iq3s_denoise_v2.strata serves cameras "
                              "['IQ3_S'], not IQ2_XS")
    classical = registry.PACKAGES_DIR / registry.CLASSICAL_PACKAGE
    with pytest.raises(ModelMismatch) as err:
        load_package(classical, architecture="strata_jdd_v1")
    assert str(err.value) == ("model architecture mismatch: package classical_v1.strata is architecture "
                              "classical, expected strata_jdd_v1")
    registry.clear_cache()
    with pytest.raises(ModelMismatch, match="serves cameras"):
        registry.load_enhancer("IQ2_XS", "cpu", package=str(path))


def test_weights_that_do_not_fit_the_config(tmp_path: Path) -> None:
    path = tmp_path / "odd.strata"
    write_package(path, jdd_manifest("odd", ("*",), {"width": 12, "dilations": [1, 2]}, {}), _net().state_dict())
    with pytest.raises(ModelMismatch, match="weights do not fit strata_jdd_v1"):
        load_package(path)


def test_unknown_architecture(tmp_path: Path) -> None:
    folder = tmp_path / "future.strata"
    folder.mkdir()
    m = {**classical_manifest().to_dict(), "architecture": "transformer_v9"}
    (folder / "manifest.json").write_text(__import__("json").dumps(m))
    with pytest.raises(ModelMismatch, match="transformer_v9, which this build does not know"):
        load_package(folder)


def test_shipped_classical_package_is_the_default_without_learned_ones(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(registry.PACKAGES_DIR / registry.CLASSICAL_PACKAGE, tmp_path)
    monkeypatch.setattr(registry, "PACKAGES_DIR", tmp_path)
    monkeypatch.setattr(registry, "_configured", lambda camera: None)
    assert registry.default_package("IQ3_S").name == "classical_v1.strata"
    _write_jdd(tmp_path / "iq3s_denoise_v2.strata", cameras=("IQ3_S",), smoke=True)
    assert registry.default_package("IQ3_S").name == "classical_v1.strata"  # a smoke package never ships
    _write_jdd(tmp_path / "iq3s_denoise_v2.strata", cameras=("IQ3_S",))
    assert registry.default_package("IQ3_S").name == "iq3s_denoise_v2.strata"
    assert registry.default_package("IQ2_XS").name == "classical_v1.strata"


def test_best_tier_takes_the_v2_package_and_fast_the_cameras_own(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(registry.PACKAGES_DIR / registry.CLASSICAL_PACKAGE, tmp_path)
    monkeypatch.setattr(registry, "PACKAGES_DIR", tmp_path)
    monkeypatch.setattr(registry, "_configured", lambda camera: None)
    _write_jdd(tmp_path / "iq3s_denoise_v2.strata", cameras=("IQ3_S",))
    assert registry.default_package("IQ3_S", "best").name == "iq3s_denoise_v2.strata"  # no v2 shipped: fast
    _write_jdd(tmp_path / registry.BEST_PACKAGE, smoke=True)
    assert registry.default_package("IQ3_S", "best").name == "iq3s_denoise_v2.strata"  # smoke never ships
    _write_jdd(tmp_path / registry.BEST_PACKAGE)
    assert registry.default_package("IQ3_S", "best").name == registry.BEST_PACKAGE
    assert registry.default_package("IQ2_XS", "best").name == registry.BEST_PACKAGE  # serves every camera
    assert registry.default_package("IQ3_S", "fast").name == "iq3s_denoise_v2.strata"
    assert registry.default_package("IQ2_XS", "fast").name == "classical_v1.strata"
    import services.config

    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(model_tier="fast"))
    assert registry.default_package("IQ3_S").name == "iq3s_denoise_v2.strata"  # the setting's tier
    assert registry.tier_orientations(None) == 1  # fast, from the setting
    assert registry.default_package("IQ3_S", "max").name == registry.BEST_PACKAGE  # max: best, turned 4 ways
    assert registry.tier_orientations("max") == registry.MAX_ORIENTATIONS == 4
    assert registry.tier_orientations("best") == 1
    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(model_tier="best", max_orientations=2))
    assert registry.tier_orientations("max") == 2 and registry.tier_orientations(None) == 1  # STRATA_MAX_ORIENTATIONS
    with pytest.raises(ValueError, match="model tier"):
        registry.default_package("IQ3_S", "huge")


def test_best_tier_turns_a_clean_shot_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """`best` averages two orientations of the best package on a clean shot (SNR at 18 % grey >= 24 dB), one on a
    noisier shot, another package or a stack's explicit model; STRATA_CLEAN_ORIENTATIONS sets the count."""
    import services.config

    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(model_tier="best"))
    best = registry.BEST_PACKAGE
    low, mid = snr_db(2e-4, 2.9e-8), snr_db(2e-3, 4.3e-6)  # the benchmark's low and mid levels
    assert snr_db(0.0, 0.0) == math.inf and low == pytest.approx(29.5, abs=0.1)
    assert mid == pytest.approx(19.5, abs=0.1)
    assert registry.tier_orientations("best", best, snr_db(0.0, 0.0)) == registry.CLEAN_ORIENTATIONS == 2
    assert registry.tier_orientations(None, best, low) == 2
    assert registry.tier_orientations("best", best, mid) == 1
    assert registry.tier_orientations("best", "iq3s_denoise_v2.strata", low) == 1  # another package: once
    assert registry.tier_orientations("best", best) == 1  # noise unknown
    assert registry.tier_orientations("fast", best, low) == 1
    assert registry.tier_orientations("max", best, mid) == registry.MAX_ORIENTATIONS
    monkeypatch.setattr(services.config, "get_settings",
                        lambda: SimpleNamespace(model_tier="best", clean_orientations=1))
    assert registry.tier_orientations("best", best, low) == 1  # STRATA_CLEAN_ORIENTATIONS=1: off


def test_setting_names_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_jdd(tmp_path / "custom.strata", cameras=("IQ2_XS",))
    import services.config

    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(model_iq2_xs=path))
    assert registry.default_package("IQ2_XS") == path.resolve()


def test_shipped_learned_packages_are_real_trainings() -> None:
    for name in registry.LEARNED_DEFAULTS.values():
        path = registry.PACKAGES_DIR / name
        if path.exists():
            assert not read_package(path).manifest.is_smoke, f"{name} is a smoke-test package"


def test_registry_keeps_one_resident_enhancer_per_package_and_device() -> None:
    registry.clear_cache()
    a = registry.load_enhancer("IQ3_S", "cpu", package="classical_v1")
    b = registry.load_enhancer("IQ2_XS", torch.device("cpu"), package="classical_v1.strata")
    assert a is b and a.receptive_field == 4
    registry.clear_cache()
    assert registry.load_enhancer("IQ3_S", "cpu", package="classical_v1") is not a


def test_compute_precision_scopes_the_default_precision() -> None:
    registry.clear_cache()
    with registry.compute_precision("float32"):
        inside = registry.load_enhancer("IQ3_S", "cpu", package="classical_v1")
    outside = registry.load_enhancer("IQ3_S", "cpu", package="classical_v1")
    assert inside is not outside
    assert sorted(str(key[2]) for key in registry._cache) == ["None", "float32"]
    registry.clear_cache()


def test_training_re_exports_the_domain_jdd_manifest() -> None:
    assert training_packages.jdd_manifest is jdd_manifest


def test_package_manifest_gives_the_halo_without_building() -> None:
    registry.clear_cache()
    manifest = registry.package_manifest("classical_v1")
    assert manifest.architecture == "classical" and manifest.halo_rows(2) == 6  # the renderer's halo today


def test_package_ref_is_portable_for_shipped_packages(tmp_path: Path) -> None:
    assert registry.package_ref(registry.default_package("IQ3_S")) == registry.default_package("IQ3_S").name
    assert registry.package_ref(tmp_path / "x.strata") == str(tmp_path / "x.strata")


def test_stack_frames_take_the_best_packages_shipped_companion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import services.config

    frames = registry.FRAMES_PACKAGES[registry.BEST_PACKAGE]
    shipped = read_package(registry.PACKAGES_DIR / frames).manifest
    best = read_package(registry.PACKAGES_DIR / registry.BEST_PACKAGE).manifest
    assert not shipped.is_smoke and shipped.architecture == best.architecture and shipped.config == best.config
    assert shipped.receptive_field == best.receptive_field  # the merge's margins hold for either
    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(stack_frames_package="auto"))
    assert registry.frames_package(registry.BEST_PACKAGE) == frames
    assert registry.frames_package(registry.BEST_PACKAGE, companion=False) == registry.BEST_PACKAGE  # a static stack
    assert registry.frames_package("strata_jdd_v1.strata") == "strata_jdd_v1.strata"  # no companion: itself
    own = _write_jdd(tmp_path / registry.BEST_PACKAGE)  # a package of that name that is not the shipped one
    assert registry.frames_package(str(own)) == str(own)
    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(stack_frames_package="same"))
    assert registry.frames_package(registry.BEST_PACKAGE) == registry.BEST_PACKAGE
    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(stack_frames_package=str(own)))
    assert registry.frames_package(registry.BEST_PACKAGE) == str(own)
    assert registry.frames_package(registry.BEST_PACKAGE, companion=False) == str(own)  # a named package: always
    monkeypatch.setattr(services.config, "get_settings",
                        lambda: SimpleNamespace(stack_frames_package="strata_jdd_v1"))
    assert registry.frames_package(registry.BEST_PACKAGE) == "strata_jdd_v1.strata"  # a shipped name, as recorded
    monkeypatch.setattr(registry, "PACKAGES_DIR", tmp_path)  # the companion not shipped: the shot's own package
    monkeypatch.setattr(services.config, "get_settings", lambda: SimpleNamespace(stack_frames_package="auto"))
    assert registry.frames_package(str(own)) == str(own)
