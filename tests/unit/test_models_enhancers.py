"""Enhancers: declared receptive field is exact, strips stitch, CFA phases, precision, classical = the ops."""

from __future__ import annotations

import pytest
import torch

from services.pipeline.models.classical import DEMOSAIC_NOISE_FACTORS, ClassicalEnhancer
from services.pipeline.models.jdd import DEFAULT_CONFIG, JDDEnhancer, JDDNet, flops_per_pixel, jdd_receptive_field
from services.pipeline.ops import demosaic_malvar, denoise_lee
from training.packages import classical_manifest, jdd_manifest

SHOT = torch.tensor([3e-3, 1.5e-3, 2.5e-3])
READ = torch.tensor([2e-5, 5e-6, 1e-5])


def _jdd(precision: torch.dtype = torch.float32, config: dict = DEFAULT_CONFIG) -> JDDEnhancer:
    torch.manual_seed(0)
    net = JDDNet(config["width"], config["dilations"])
    torch.nn.init.normal_(net.tail.weight, std=0.02)
    return JDDEnhancer(jdd_manifest("t", ("*",), config, {}), net, torch.device("cpu"), precision)


def _classical() -> ClassicalEnhancer:
    return ClassicalEnhancer(classical_manifest(), torch.device("cpu"))


def _mosaic(h: int, w: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    smooth = torch.nn.functional.interpolate(torch.rand(1, 1, h // 8 + 1, w // 8 + 1, generator=g), (h, w),
                                             mode="bilinear", align_corners=False)
    return (smooth * 0.8 + torch.rand(1, 1, h, w, generator=g) * 0.3).clamp(0, 1.2)


def test_default_architecture_numbers() -> None:
    assert jdd_receptive_field(DEFAULT_CONFIG) == 37
    assert sum(p.numel() for p in JDDNet(48).parameters()) == 258_108
    assert flops_per_pixel(DEFAULT_CONFIG) == pytest.approx(128_736)


@pytest.mark.parametrize("make", [_jdd, _classical])
def test_output_shape_dtype_and_bad_input(make: object) -> None:
    enh = make()  # type: ignore[operator]
    x = _mosaic(90, 86)
    out = enh.enhance(x, "GBRG", SHOT, READ)
    assert out.shape == (1, 3, 90, 86) and out.dtype == torch.float32
    with pytest.raises(ValueError, match=r"mosaic must have shape \(B, 1, H, W\), got \(1, 3, 90, 86\)"):
        enh.enhance(out, "RGGB", SHOT, READ)
    with pytest.raises(ValueError, match="cfa must be one of"):
        enh.enhance(x, "RGBG", SHOT, READ)
    with pytest.raises(ValueError, match="noise must be >= 0"):
        enh.enhance(x, "RGGB", -SHOT, READ)


@pytest.mark.parametrize("size", [(2, 2), (9, 9), (16, 30), (40, 12)])
def test_frames_smaller_than_the_receptive_field_render(size: tuple[int, int]) -> None:
    """Thumbnails: the canvas is reflected more than once instead of refusing the frame."""
    from services.pipeline.ops.filters import reflect_pad_any

    out = _jdd().enhance(_mosaic(*size), "GRBG", SHOT, READ)
    assert out.shape == (1, 3, *size) and bool(torch.isfinite(out).all())
    x = _mosaic(12, 10)
    assert torch.equal(reflect_pad_any(x, (3, 2, 4, 5)), torch.nn.functional.pad(x, (3, 2, 4, 5), mode="reflect"))
    rows = torch.arange(12.0).view(1, 1, 12, 1).expand(1, 1, 12, 10)  # each pixel holds its row index
    big = reflect_pad_any(rows, (25, 0, 7, 30))  # past the far edge: reflected again
    assert big.shape == (1, 1, 49, 35)
    index = torch.arange(49.0).view(49, 1) - 7  # the row each output row stands for
    assert bool(((big[0, 0] - index) % 2 == 0).all())  # every row comes from a row of the same CFA parity


@pytest.mark.parametrize("make", [_jdd, _classical])
@pytest.mark.parametrize("y", [60, 61])
def test_receptive_field_is_exact(make: object, y: int) -> None:
    """Output row y ignores input beyond the declared radius, and (tightness) sees the row at that radius."""
    enh = make()  # type: ignore[operator]
    rf = enh.receptive_field
    x = _mosaic(128, 64)
    base = enh.enhance(x, "RGGB", SHOT, READ)[..., y, :]
    far, edge = x.clone(), x.clone()
    sign = 1 if y % 2 == 0 else -1  # an even row's block reaches furthest downwards, an odd row's upwards
    beyond = slice(y + rf + 1, None) if sign > 0 else slice(0, y - rf)
    far[..., beyond, :] = torch.rand_like(far[..., beyond, :])
    edge[..., y + sign * rf, :] += 0.5
    assert torch.equal(enh.enhance(far, "RGGB", SHOT, READ)[..., y, :], base)
    assert not torch.equal(enh.enhance(edge, "RGGB", SHOT, READ)[..., y, :], base)


@pytest.mark.parametrize("cfa", ["RGGB", "BGGR", "GRBG", "GBRG"])
@pytest.mark.parametrize("height", [120, 121])
def test_strips_stitch_to_whole(cfa: str, height: int) -> None:
    enh = _jdd()
    rf = enh.receptive_field
    halo = rf + rf % 2
    x = _mosaic(height, 70, seed=3)
    whole = enh.enhance(x, cfa, SHOT, READ)
    cuts = [0, 40, 42, 82, height]
    parts = []
    for y0, y1 in zip(cuts[:-1], cuts[1:], strict=True):
        top, bottom = max(0, y0 - halo), min(height, y1 + halo)
        parts.append(enh.enhance(x[..., top:bottom, :], cfa, SHOT, READ)[..., y0 - top : y1 - top, :])
    stitched = torch.cat(parts, dim=-2)
    assert (stitched - whole).abs().max().item() < 0.5 / 65535  # within 1 LSB of 16 bits after quantisation


@pytest.mark.parametrize(("cfa", "dy", "dx"), [("GRBG", 0, 1), ("GBRG", 1, 0), ("BGGR", 1, 1)])
def test_every_cfa_phase_computes_like_rggb(cfa: str, dy: int, dx: int) -> None:
    """A crop of an RGGB mosaic starting at (dy, dx) has phase ``cfa``; away from the borders the network must
    give the RGGB result for the same pixels, so all phases have the same quality."""
    enh = _jdd()
    big = _mosaic(112, 112, seed=5)
    ref = enh.enhance(big, "RGGB", SHOT, READ)
    crop = big[..., dy : dy + 110, dx : dx + 110]
    out = enh.enhance(crop, cfa, SHOT, READ)
    m = enh.receptive_field + 1
    inner = out[..., m:-m, m:-m]
    expected = ref[..., dy + m : dy + 110 - m, dx + m : dx + 110 - m]
    assert (inner - expected).abs().max().item() < 1e-5


def test_bf16_autocast_agrees_with_fp32() -> None:
    x = _mosaic(96, 96, seed=7)
    fp32 = _jdd(torch.float32).enhance(x, "RGGB", SHOT, READ)
    bf16 = _jdd(torch.bfloat16).enhance(x, "RGGB", SHOT, READ)
    diff = (fp32 - bf16).abs()
    assert bf16.dtype == torch.float32
    assert diff.mean().item() < 2e-3 and diff.max().item() < 2e-2


def test_float16_the_gpu_default_stays_finite_and_close_on_highlights_and_heavy_noise() -> None:
    """float16 has 10 bits of mantissa but a small range: the shipped package's activations must stay inside it on
    clipped highlights after a strong white balance and at the highest noise, and near the float32 render."""
    from services.pipeline.models import load_package
    from services.pipeline.models.package import GPU_PRECISION, compute_dtype_for
    from services.pipeline.models.registry import BEST_PACKAGE, PACKAGES_DIR

    assert compute_dtype_for(_shipped_best().manifest, torch.device("cuda"), None) == torch.float16 == \
        getattr(torch, GPU_PRECISION)
    assert compute_dtype_for(_shipped_best().manifest, torch.device("cpu"), None) == torch.float32
    x = _mosaic(64, 64, seed=11) * 4.0  # white-balanced highlights up to ~5
    shot, read = SHOT * 20, READ * 100
    fp32 = load_package(PACKAGES_DIR / BEST_PACKAGE, "cpu", precision="float32").enhance(x, "RGGB", shot, read)
    fp16 = load_package(PACKAGES_DIR / BEST_PACKAGE, "cpu", precision="float16").enhance(x, "RGGB", shot, read)
    assert bool(torch.isfinite(fp16).all())
    assert (fp16 - fp32).abs().max().item() < 2e-2 * float(fp32.abs().max())


def test_classical_is_the_renderers_malvar_and_lee() -> None:
    x = _mosaic(64, 80, seed=9)
    f = torch.tensor(DEMOSAIC_NOISE_FACTORS)
    expected = denoise_lee(demosaic_malvar(x, "GRBG"), f * SHOT, f * READ, radius=2)
    assert torch.allclose(_classical().enhance(x, "GRBG", SHOT, READ), expected, atol=1e-7, rtol=0)


def _shipped_best() -> JDDEnhancer:
    from services.pipeline.models import load_package
    from services.pipeline.models.registry import BEST_PACKAGE, PACKAGES_DIR

    enh = load_package(PACKAGES_DIR / BEST_PACKAGE, "cpu", precision="float32")
    assert isinstance(enh, JDDEnhancer)
    return enh


@pytest.mark.parametrize("y", [90, 91])
def test_best_package_receptive_field_is_exact(y: int) -> None:
    """The shipped `best` package (its real weights, receptive field 61): output row y ignores input beyond the
    declared radius and sees the row at it."""
    enh = _shipped_best()
    rf = enh.receptive_field
    assert rf == 61
    x = _mosaic(200, 48)
    base = enh.enhance(x, "RGGB", SHOT, READ)[..., y, :]
    far, edge = x.clone(), x.clone()
    sign = 1 if y % 2 == 0 else -1
    beyond = slice(y + rf + 1, None) if sign > 0 else slice(0, y - rf)
    far[..., beyond, :] = torch.rand_like(far[..., beyond, :])
    edge[..., y + sign * rf, :] += 0.5
    assert torch.equal(enh.enhance(far, "RGGB", SHOT, READ)[..., y, :], base)
    assert not torch.equal(enh.enhance(edge, "RGGB", SHOT, READ)[..., y, :], base)


@pytest.mark.parametrize("cfa", ["RGGB", "GBRG"])
def test_best_package_strips_stitch_to_whole(cfa: str) -> None:
    enh = _shipped_best()
    halo = enh.receptive_field + enh.receptive_field % 2
    height = 241
    x = _mosaic(height, 40, seed=5)
    whole = enh.enhance(x, cfa, SHOT, READ)
    cuts = [0, 80, 82, 170, height]
    parts = []
    for y0, y1 in zip(cuts[:-1], cuts[1:], strict=True):
        top, bottom = max(0, y0 - halo), min(height, y1 + halo)
        parts.append(enh.enhance(x[..., top:bottom, :], cfa, SHOT, READ)[..., y0 - top : y1 - top, :])
    assert (torch.cat(parts, dim=-2) - whole).abs().max().item() < 0.5 / 65535


def test_an_ensemble_is_the_mean_of_the_turned_renders_and_its_strips_stitch() -> None:
    """The `max` tier's self-ensemble: the mean of the renders of the mosaic turned to the first N orientations of
    ENSEMBLE_ORDER (each with the pattern it then has, odd sizes too), turned back; strips with the package's halo
    still stitch to the whole frame."""
    from services.pipeline.ops.cfa import orient, oriented_cfa, unorient

    enh = _shipped_best()
    height, width = 121, 34
    x = _mosaic(height, width, seed=7)
    whole = enh.enhance(x, "GBRG", SHOT, READ, orientations=4)
    turned = [unorient(enh.enhance(orient(x, k).contiguous(), oriented_cfa("GBRG", k, height, width), SHOT, READ), k)
              for k in range(4)]
    assert torch.allclose(whole, sum(turned) / 4, atol=1e-6)
    pair = enh.enhance(x, "GBRG", SHOT, READ, orientations=2)  # identity and a quarter turn (ENSEMBLE_ORDER)
    assert torch.allclose(pair, (turned[0] + turned[2]) / 2, atol=1e-6)
    assert (whole - turned[0]).abs().max().item() > 1e-4  # not the plain render
    halo = enh.receptive_field + enh.receptive_field % 2
    cuts = [0, 40, 43, height]
    parts = []
    for y0, y1 in zip(cuts[:-1], cuts[1:], strict=True):
        top, bottom = max(0, y0 - halo), min(height, y1 + halo)
        part = enh.enhance(x[..., top:bottom, :], "GBRG", SHOT, READ, orientations=4)
        parts.append(part[..., y0 - top : y1 - top, :])
    assert (torch.cat(parts, dim=-2) - whole).abs().max().item() < 0.5 / 65535
    with pytest.raises(ValueError, match="orientations"):
        enh.enhance(x, "GBRG", SHOT, READ, orientations=3)


def test_folded_network_is_the_same_function() -> None:
    """The GPU's reduced-precision form (conv2 biases folded into the convolutions after them, bias + ReLU in one
    call) computes the network's function: checked in float64 on the CPU with trained-like (non-zero) biases,
    and an output pixel depends on its receptive field only (bit-exact strips are checked on a GPU by
    scripts/gpu/model_precision.py: the CPU's convolutions may block a smaller input differently)."""
    from services.pipeline.models.jdd import FoldedJDD, folded_for

    torch.manual_seed(1)
    net = JDDNet(16, (1, 2, 1)).double().eval()
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.1)
    packed, noise = torch.rand(1, 4, 40, 44, dtype=torch.float64), torch.rand(1, 4, 40, 44, dtype=torch.float64)
    folded = FoldedJDD(net, torch.float64, fused=False)
    with torch.inference_mode():
        whole = folded(packed, noise)
        torch.testing.assert_close(whole, net(packed, noise), rtol=1e-10, atol=1e-10)
        top = folded(packed[..., :24, :], noise[..., :24, :])  # rows 0..24 - 2r of the output
        torch.testing.assert_close(top, whole[..., : top.shape[-2], :], rtol=1e-12, atol=1e-12)
        padded = FoldedJDD(net, torch.float64, fused=False, width=24)  # 8 zero channels more
        assert padded.blocks[0][1].shape == (24, 24, 3, 3)
        torch.testing.assert_close(padded(packed, noise), whole, rtol=1e-12, atol=1e-12)
        wide = FoldedJDD(net, torch.float64, fused=False, width=24, full_width=True)  # columns padded, then cropped
        torch.testing.assert_close(wide(packed, noise), whole, rtol=1e-12, atol=1e-12)
    assert folded_for(net.float(), torch.device("cpu"), torch.float16) is None  # the CPU runs the plain module
    assert folded_for(net.float(), torch.device("cuda"), torch.float32) is None  # so does the exact fallback


def test_a_batch_shard_may_pause_between_an_ensembles_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a self-ensemble's model passes the render calls the device gate's yield point (a batch shard pauses
    there while an interactive one holds the device, services/pipeline/gate.py); the result is the same."""
    from services.pipeline.models import base

    enh = _shipped_best()
    x = _mosaic(40, 34, seed=3)
    calls: list[int] = []
    monkeypatch.setattr(base, "yield_to_urgent", lambda: calls.append(1) or 0.0)
    once = enh.enhance(x, "RGGB", SHOT, READ)
    assert calls == []
    pair = enh.enhance(x, "RGGB", SHOT, READ, orientations=2)
    assert len(calls) == 1 and pair.shape == once.shape
