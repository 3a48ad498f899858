"""Would a filter after fusion that suits every camera and output space generalise? (issue 17, session 49, CPU probe)

Session 48 found that one linear 5 x 5 filter on a stack's result, fitted on training photographs in the output's
sRGB codes (every colour's taps and a bias), gains on held-out stacks. To ship one, it would run before colour
(the service renders several output spaces from one result, and cameras differ in their matrices): in
white-balanced camera RGB, each colour filtered alone, its taps summing to one (flat areas and colour unchanged).
This probe fits that filter and its neighbours by least squares on training photographs' stacks and scores each on
held-out photographs' stacks, in sRGB PSNR:

- space: ``lin`` (white-balanced camera RGB, each pixel weighted by the square of the sRGB curve's slope),
  ``gam`` (the same to the power 1/2.2, unweighted) or ``srgb`` (the output's sRGB values, as session 48);
- taps: ``own`` (each colour's 24 differences to its centre) or ``cross`` (every colour's 72).

Stacks are merged and rendered as ``strata bench stack`` does (:func:`services.pipeline.stack.render_fused_linear`),
4 frames, sub-pixel shifts up to 1.5 px, a moving object in every third stack, CFA phases cycled, at scales 0.0215
and 0.043.

    python scripts/experiments/fusion_filter_probe.py --noise 0.002 --json OUT.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from lab.quality.stack_bench import BORDER, _decoded, _merge
from lab.synth.stack_synth import synthesize_stack
from services.pipeline.ops.colour import srgb_encode
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import frame_shifts, render_fused_linear, stack_noise_factors, stack_params

OFFSETS = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3) if (dy, dx) != (0, 0)]
PHASES = ("RGGB", "GRBG", "GBRG", "BGGR")
Stack = dict[str, np.ndarray]  # x: the render before colour, t: the truth, both (3, H, W); m: the colour matrix


def stack(photo: int, scale: float, seed: int, args: argparse.Namespace) -> Stack:
    with tempfile.TemporaryDirectory() as tmp:
        shot = synthesize_stack(Path(tmp) / "s", frames=args.frames, scale=scale, seed=seed, noise=args.noise,
                                content=f"photo:{photo:03d}", photos_dir=args.photos, cfa=PHASES[seed % 4],
                                moving_object=seed % 3 == 0)
        decoded = [_decoded(p, Path(tmp) / f"raw_{i:02d}.npy") for i, p in enumerate(shot.files)]
    own = shot_render_params(decoded[0][1], decoded[0][0])
    params = stack_params(own, args.frames, frame_shifts(decoded[0], decoded))
    fused = _merge(decoded[0], decoded, params, 1, "cpu", None, {})
    with torch.inference_mode():
        x = render_fused_linear(torch.from_numpy(np.ascontiguousarray(fused, dtype=np.float32))[None], params,
                                stack_noise_factors(False))[0].numpy().astype(np.float64)
    gains = np.asarray(params.gains, dtype=np.float64)[:, None, None]
    return {"x": x, "t": shot.camera_rgb.transpose(2, 0, 1).astype(np.float64) * gains,
            "m": np.asarray(params.rgb_cam, dtype=np.float64)}


def to_srgb(img: np.ndarray, m: np.ndarray) -> np.ndarray:
    lin = np.clip(np.einsum("ij,jhw->ihw", m, img), 0.0, 1.0)
    return srgb_encode(torch.from_numpy(lin)).numpy()


def into(s: Stack, key: str, space: str) -> np.ndarray:
    img = s[key]
    if space == "gam":
        return np.sign(img) * np.abs(img) ** (1 / 2.2)
    return to_srgb(img, s["m"]) if space == "srgb" else img


def back(img: np.ndarray, m: np.ndarray, space: str) -> np.ndarray:
    if space == "gam":
        return to_srgb(np.sign(img) * np.abs(img) ** 2.2, m)
    return np.clip(img, 0.0, 1.0) if space == "srgb" else to_srgb(img, m)


def differences(x: np.ndarray) -> np.ndarray:
    """(3, H, W) -> (3, 24, pixels inside BORDER): each colour's differences to its centre."""
    p = np.pad(x, ((0, 0), (2, 2), (2, 2)), mode="reflect")
    h, w = x.shape[1:]
    d = np.stack([p[:, 2 + dy: 2 + dy + h, 2 + dx: 2 + dx + w] - x for dy, dx in OFFSETS], axis=1)
    return d[:, :, BORDER:-BORDER, BORDER:-BORDER].reshape(3, len(OFFSETS), -1)


def design(x: np.ndarray, c: int, taps: str) -> np.ndarray:
    d = differences(x)
    return (d.reshape(3 * len(OFFSETS), -1) if taps == "cross" else d[c]).T


def weight(s: Stack, space: str) -> np.ndarray:
    if space != "lin":
        return np.ones(s["x"][0, BORDER:-BORDER, BORDER:-BORDER].size)
    lum = np.einsum("ij,jhw->ihw", s["m"], s["t"]).mean(axis=0)[BORDER:-BORDER, BORDER:-BORDER].reshape(-1)
    return np.maximum(lum, 0.0031308) ** (-2 * 1.4 / 2.4)  # the sRGB curve's slope, squared (up to a constant)


def fit(train: list[Stack], space: str, taps: str) -> list[np.ndarray]:
    """Per colour, the weights of its differences (weighted least squares, a touch of ridge)."""
    out = []
    for c in range(3):
        gram: np.ndarray | float = 0.0
        rhs: np.ndarray | float = 0.0
        for s in train:
            x, t = into(s, "x", space), (to_srgb(s["t"], s["m"]) if space == "srgb" else into(s, "t", space))
            d, w = design(x, c, taps), weight(s, space)
            r = (t[c] - x[c])[BORDER:-BORDER, BORDER:-BORDER].reshape(-1)
            gram, rhs = gram + (d * w[:, None]).T @ d, rhs + (d * w[:, None]).T @ r
        g = np.asarray(gram)
        out.append(np.linalg.solve(g + 1e-6 * np.trace(g) / len(g) * np.eye(len(g)), np.asarray(rhs)))
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    inner = (slice(None), slice(BORDER, -BORDER), slice(BORDER, -BORDER))
    return float(10 * np.log10(1.0 / np.mean((a[inner] - b[inner]) ** 2)))


def gain(s: Stack, coef: list[np.ndarray], space: str, taps: str) -> float:
    """The filter's change of the stack's sRGB PSNR, dB."""
    truth, x = to_srgb(s["t"], s["m"]), into(s, "x", space)
    y = x.copy()
    for c in range(3):
        y[c, BORDER:-BORDER, BORDER:-BORDER] += (design(x, c, taps) @ coef[c]).reshape(y.shape[1] - 2 * BORDER, -1)
    return psnr(back(y, s["m"], space), truth) - psnr(to_srgb(s["x"], s["m"]), truth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    ap.add_argument("--fit", type=int, nargs="+", default=list(range(1, 11)), help="training photographs")
    ap.add_argument("--test", type=int, nargs="+", default=[33, 36, 38, 40], help="held-out photographs")
    ap.add_argument("--scales", type=float, nargs="+", default=[0.0215, 0.043])
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--noise", type=float, default=0.002)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    train = [stack(p, s, 7000 + 10 * p + i, args) for p in args.fit for i, s in enumerate(args.scales)]
    test = {f"photo {p:03d} @ {s}": stack(p, s, 7000 + 10 * p + i, args)
            for p in args.test for i, s in enumerate(args.scales)}
    rows = []
    for space, taps in itertools.product(("lin", "gam", "srgb"), ("own", "cross")):
        coef = fit(train, space, taps)
        row = {"space": space, "taps": taps, **{k: round(gain(s, coef, space, taps), 3) for k, s in test.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"noise": args.noise, "frames": args.frames, "fit": args.fit,
                                         "scales": args.scales, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
