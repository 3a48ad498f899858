"""Shard rendering: strips stitch to the whole-frame render; the colour contract round-trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.pipeline.ops import srgb_encode, to_uint16
from services.pipeline.render import RenderParams, halo_rows, render_mosaic, render_strip
from services.raw.colour import SRGB_TO_XYZ_D65, camera_to_srgb_matrix
from tests.unit.test_ops_synthetic import COLOR_MATRIX, mosaic_of, psnr, textured_rgb

H, W = 60, 48


def _params(cfa: str = "RGGB", **kw: object) -> RenderParams:
    rgb_cam = camera_to_srgb_matrix(COLOR_MATRIX)
    base: dict = dict(cfa=cfa, black=(512.0, 510.0, 514.0, 511.0), white=16383.0, gains=(2.1, 1.0, 1.6),
                      rgb_cam=tuple(tuple(r) for r in rgb_cam), noise_shot=1e-3, noise_read=2e-5)
    base.update(kw)
    return RenderParams(**base)


def _raw(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mosaic = mosaic_of(textured_rgb(H, W, seed=seed, cutoff=0.2), "RGGB").numpy() * 0.6
    noisy = mosaic + rng.normal(0, 0.01, mosaic.shape)
    return np.clip(512 + noisy * (16383 - 512), 0, 65535).astype(np.uint16)


def test_halo_covers_receptive_radius() -> None:
    assert halo_rows(_params()) == 6  # classical package: receptive field 4 + sharpen 2


@pytest.mark.parametrize(
    "cuts",
    [[0, 2, H], [0, H - 2, H], [0, 10, 20, 30, 40, 50, H], [0, 8, 14, 16, 46, H], [0, 28, 30, 32, H]],
)
def test_strips_stitch_to_whole_frame(cuts: list[int]) -> None:
    raw = _raw()
    params = _params()
    whole = render_mosaic(raw, params)
    strips = [render_strip(raw, a, b, params) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    stitched = np.concatenate(strips)
    assert stitched.dtype == np.uint16 and stitched.shape == (H, W, 3)
    diff = np.abs(stitched.astype(np.int32) - whole.astype(np.int32)).max()
    assert diff <= 1
    assert diff == 0  # every op is size-independent, so stitching is bit-exact on the CPU


def test_an_ensemble_render_stitches_exactly_and_round_trips() -> None:
    """The `max` tier's self-ensemble (4 orientations) on a strip equals the whole frame's rows, bit for bit on the
    CPU; RenderParams keeps the count through its dict and refuses a count that is not 1, 2, 4 or 8."""
    raw = _raw(2)
    params = _params("GRBG", orientations=4)
    whole = render_mosaic(raw, params)
    assert not np.array_equal(whole, render_mosaic(raw, _params("GRBG")))
    cuts = [0, 14, 32, H]
    stitched = np.concatenate([render_strip(raw, a, b, params) for a, b in zip(cuts[:-1], cuts[1:], strict=True)])
    assert np.array_equal(stitched, whole)
    assert RenderParams.from_dict(params.to_dict()).orientations == 4
    with pytest.raises(ValueError, match="orientations"):
        _params(orientations=3)


def test_strip_reads_only_its_rows() -> None:
    raw = _raw(1)

    class Guarded(np.ndarray):
        touched: list[tuple[int, int]] = []

        def __getitem__(self, key: object) -> np.ndarray:
            assert isinstance(key, slice)
            Guarded.touched.append((key.start, key.stop))
            return np.asarray(self).__getitem__(key)

    out = render_strip(raw.view(Guarded), 20, 30, _params())
    assert out.shape == (10, W, 3) and Guarded.touched == [(14, 36)]


def test_memmap_and_normalized_input(tmp_path: object) -> None:
    raw = _raw(2)
    params = _params()
    path = f"{tmp_path}/raw.u16"
    raw.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r", shape=raw.shape)
    np.testing.assert_array_equal(render_strip(mm, 10, 20, params), render_mosaic(raw, params)[10:20])
    black = np.tile(np.array(params.black, np.float32).reshape(2, 2), (H // 2, W // 2))
    normalized = np.clip((raw - black) / (params.white - black), 0, 1).astype(np.float32)
    a = render_mosaic(normalized, params, normalized=True).astype(np.int32)
    assert np.abs(a - render_mosaic(raw, params).astype(np.int32)).max() <= 1


@pytest.mark.parametrize("cfa", ["RGGB", "GBRG"])
def test_noise_free_unprocessed_image_renders_to_ground_truth(cfa: str) -> None:
    linear = textured_rgb(96, 96, seed=7, cutoff=0.08, lo=0.05, hi=0.7)  # (3, H, W) linear sRGB
    cam_rgb = COLOR_MATRIX @ SRGB_TO_XYZ_D65
    cam_rgb_n = cam_rgb / cam_rgb.sum(axis=1, keepdims=True)
    neutral = cam_rgb.sum(axis=1) / cam_rgb.sum(axis=1)[1]
    camera = np.einsum("ij,jhw->ihw", neutral[:, None] * cam_rgb_n, linear)  # unprocess contract
    mosaic = mosaic_of(camera, cfa).numpy().astype(np.float32)
    assert mosaic.min() >= 0 and mosaic.max() <= 1
    params = _params(cfa, gains=tuple(1.0 / neutral), noise_shot=1e-6, noise_read=1e-8)
    out = render_mosaic(mosaic, params, normalized=True)
    truth = to_uint16(srgb_encode(torch.from_numpy(linear))).numpy().transpose(1, 2, 0)
    crop = (slice(4, -4), slice(4, -4))
    assert psnr(out[crop], truth[crop], 65535.0) > 35.0


def test_params_round_trip_and_validation() -> None:
    params = _params()
    d = params.to_dict()
    assert isinstance(d["rgb_cam"], list) and RenderParams.from_dict(d) == params
    with pytest.raises(ValueError, match="cfa"):
        _params(cfa="RGB")
    with pytest.raises(ValueError, match="even row"):
        render_strip(_raw(), 3, 9, params)
    with pytest.raises(ValueError, match="inside"):
        render_strip(_raw(), 0, H + 2, params)


def test_one_model_pass_renders_every_output_space() -> None:
    """Extra output spaces come from the same pass: the primary result is bit-identical to a single-space render,
    each extra one to a render with that space as the primary; the shot's params carry them (and round-trip)."""
    from dataclasses import replace

    from services.pipeline.render import SpaceColour, render_strip_spaces
    from services.raw.colour import xyz_d50_to_output_matrix

    raw, params = _raw(), _params()
    to_adobe = xyz_d50_to_output_matrix("adobergb") @ np.linalg.inv(xyz_d50_to_output_matrix("srgb"))
    adobe = tuple(tuple(float(v) for v in row) for row in to_adobe @ np.asarray(params.rgb_cam))
    multi = replace(params, extra_spaces=(SpaceColour("adobergb", adobe, "adobergb"),
                                          SpaceColour("linear", params.rgb_cam, "linear")))
    assert multi.spaces == ("srgb", "adobergb", "linear")
    assert RenderParams.from_dict(multi.to_dict()) == multi
    old = {k: v for k, v in params.to_dict().items() if k not in ("space", "extra_spaces")}
    assert RenderParams.from_dict(old) == params  # rows from before several spaces
    srgb, adobergb, linear = render_strip_spaces(raw, 10, 40, multi)
    np.testing.assert_array_equal(srgb, render_strip(raw, 10, 40, params))
    np.testing.assert_array_equal(adobergb, render_strip(raw, 10, 40, replace(params, rgb_cam=adobe,
                                                                              transfer="adobergb")))
    np.testing.assert_array_equal(linear, render_strip(raw, 10, 40, replace(params, transfer="linear")))
    seen: dict[int, np.ndarray] = {}  # the rows still on the device, handed over before their download
    into = [np.zeros((30, raw.shape[1], 3), np.uint16) for _ in range(3)]
    render_strip_spaces(raw, 10, 40, multi, into=into, on_device=lambda i, rows: seen.update({i: rows.cpu().numpy()}))
    assert sorted(seen) == [0, 1, 2]
    for i, expected in enumerate((srgb, adobergb, linear)):
        np.testing.assert_array_equal(seen[i], expected)
        np.testing.assert_array_equal(into[i], expected)


def test_blown_highlights_render_white_and_strips_still_stitch() -> None:
    """A region at the raw white level in every site renders neutral white, not in the colour of the gains
    (2.1, 1, 1.6 here: magenta before); the rest of the frame is as before, and strips stitch exactly."""
    raw = _raw(3)
    raw[20:40, 10:30] = 16383
    params = _params()
    out = render_mosaic(raw, params)
    patch = out[26:34, 16:24].reshape(-1, 3).astype(np.int64)
    assert patch.min() >= 65000, patch.mean(axis=0)
    cuts = [0, 22, 32, H]  # through the blown region
    stitched = np.concatenate([render_strip(raw, a, b, params) for a, b in zip(cuts, cuts[1:], strict=False)])
    np.testing.assert_array_equal(stitched, out)
