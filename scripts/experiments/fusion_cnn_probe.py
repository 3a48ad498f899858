"""Would a small network after fusion generalise where a linear filter does not? (issue 17, session 48, CPU probe)

``fusion_oracle.py --fit-content`` found that one linear 5 x 5 filter on a stack's result, fitted on training
photographs at one scale, gains on held-out photographs at that scale and loses at others. This probe trains a small
convolutional network instead (inputs: today's result, A and B in the output's sRGB codes, each stack merged as
``strata bench stack`` merges it; three 3 x 3 layers of 32 channels; a residual on today's result, its last layer
zero at the start) on the training photographs' stacks at several scales, and scores it on held-out photographs'
stacks at each scale. Mid noise, 4 and 8 frames. CPU, a few minutes: a probe of the lever, not a package.

    python scripts/experiments/fusion_cnn_probe.py --photos ../shared/data/photos --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fusion_oracle import _stack  # noqa: E402

from lab.quality.stack_bench import BORDER, psnr  # noqa: E402

KEYS = ("today", "A", "B")


def _sample(content: str, frames: int, scale: float, seed: int, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """(H, W, 3) float32 in [0, 1] for today, A, B and the truth, cached under --cache."""
    path = args.cache / f"{content.replace(':', '_')}-{frames}-{scale}-{seed}-{args.noise}.npz"
    if not path.exists():
        ns = argparse.Namespace(noise=args.noise, photos=args.photos, raw_merge=False)
        r, truth = _stack(content, frames, ns, seed=seed, scale=scale)
        arrays = {"truth": truth, **{k: r[k] for k in KEYS}}
        np.savez(path, **arrays)  # type: ignore[arg-type]
    with np.load(path) as z:
        return {k: z[k].astype(np.float32) / 65535.0 for k in (*KEYS, "truth")}


class Probe(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(9, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(width, 3, 3, padding=1))
        last = self.body[-1]
        assert isinstance(last, nn.Conv2d)
        nn.init.zeros_(last.weight)
        if last.bias is not None:
            nn.init.zeros_(last.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 9, H, W) -> (N, 3, H, W): today + a residual
        return x[:, :3] + self.body(x)


def _tensor(s: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.concatenate([s[k] for k in KEYS], axis=2).transpose(2, 0, 1)
    y = s["truth"].transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


def _codes(t: torch.Tensor) -> np.ndarray:
    """(3, H, W) in [0, 1] -> (H - 2 BORDER, W - 2 BORDER, 3) uint16 codes."""
    inner = t[:, BORDER:-BORDER, BORDER:-BORDER].clamp(0, 1)
    return (inner.permute(1, 2, 0).numpy() * 65535.0 + 0.5).astype(np.uint16)


def _linear_fit(train: list[tuple[torch.Tensor, torch.Tensor]], channels: int) -> torch.Tensor:
    """One 5 x 5 linear filter (every input channel of the first ``channels``, a bias) fitted by least squares on
    every training stack: (3, channels * 25 + 1)."""
    n = channels * 25 + 1
    gram, xty = torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, 3, dtype=torch.float64)
    for x, y in train:
        f = _unfold(x[:channels])
        t = y[:, BORDER:-BORDER, BORDER:-BORDER].reshape(3, -1).T.double()
        gram, xty = gram + f.T @ f, xty + f.T @ t
    return torch.linalg.solve(gram + 1e-6 * torch.eye(gram.shape[0], dtype=torch.float64), xty).T


def _unfold(x: torch.Tensor) -> torch.Tensor:
    """(C, H, W) -> (pixels inside BORDER, C * 25 + 1) float64 5 x 5 neighbourhoods and a one."""
    patches = F.unfold(x[None].double(), 5)[0]  # (C * 25, (H - 4) * (W - 4))
    h, w = x.shape[1] - 4, x.shape[2] - 4
    inner = patches.view(-1, h, w)[:, BORDER - 2: h - BORDER + 2, BORDER - 2: w - BORDER + 2]
    inner = inner.reshape(patches.shape[0], -1)
    return torch.cat([inner.T, torch.ones(inner.shape[1], 1, dtype=torch.float64)], dim=1)


def _train(net: Probe, train: list[tuple[torch.Tensor, torch.Tensor]], args: argparse.Namespace,
           rng: np.random.Generator) -> int:
    """Random crops of the training stacks, L1 against the truth, for --minutes: the steps taken."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    t0, step = time.time(), 0
    while time.time() - t0 < args.minutes * 60:
        xs, ys = [], []
        for _ in range(args.batch):
            x, y = train[int(rng.integers(len(train)))]
            h, w = x.shape[1:]
            c = min(args.crop, h - 2 * BORDER, w - 2 * BORDER)
            top, left = int(rng.integers(BORDER, h - BORDER - c + 1)), int(rng.integers(BORDER, w - BORDER - c + 1))
            xs.append(x[:, top: top + c, left: left + c])
            ys.append(y[:, top: top + c, left: left + c])
        size = min(t.shape[-1] for t in xs), min(t.shape[-2] for t in xs)
        x = torch.stack([t[:, : size[1], : size[0]] for t in xs])
        y = torch.stack([t[:, : size[1], : size[0]] for t in ys])
        loss = F.l1_loss(net(x)[..., 4:-4, 4:-4], y[..., 4:-4, 4:-4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.5f} ({time.time() - t0:.0f} s)", flush=True)
    return step


@torch.inference_mode()
def _score(net: Probe, linear: dict[str, torch.Tensor], args: argparse.Namespace) -> list[dict[str, object]]:
    """Every held-out stack at every scale: today's PSNR and each probe's change."""
    rows: list[dict[str, object]] = []
    for scale in args.scales:
        for content in args.test:
            for frames in (4, 8):
                x, y = _tensor(_sample(content, frames, scale, 3, args))
                truth = _codes(y)
                today = psnr(_codes(x[:3]), truth)
                row: dict[str, object] = {"scale": scale, "content": content, "frames": frames,
                                          "today": round(today, 3)}
                row["network"] = round(psnr(_codes(net(x[None])[0]), truth) - today, 3)
                for name, coef in linear.items():
                    pred = (_unfold(x[: (coef.shape[1] - 1) // 25]) @ coef.T).float()
                    image = pred.T.reshape(3, x.shape[1] - 2 * BORDER, x.shape[2] - 2 * BORDER)
                    row[name] = round(psnr(_codes(F.pad(image, (BORDER,) * 4)), truth) - today, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    ap.add_argument("--fit", type=int, default=16, help="training photographs 001..N")
    ap.add_argument("--scales", type=float, nargs="+", default=[0.0215, 0.043, 0.1])
    ap.add_argument("--test", nargs="+", default=["photo:033", "photo:036", "photo:038", "photo:040",
                                                   "skimage:astronaut"])
    ap.add_argument("--noise", type=float, default=0.002)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--crop", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/fusion-probe-cache"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    train = [_tensor(_sample(f"photo:{i:03d}", n, s, 11, args)) for i in range(1, args.fit + 1)
             for n in (4, 8) for s in args.scales]
    print(f"{len(train)} training stacks", flush=True)
    linear = {name: _linear_fit(train, channels) for name, channels in (("linear: today", 3), ("linear: all", 9))}
    net = Probe()
    step = _train(net, train, args, np.random.default_rng(0))
    rows = _score(net, linear, args)
    if args.json:
        args.json.write_text(json.dumps({"steps": step, "minutes": args.minutes, "fit_photos": args.fit,
                                         "scales": args.scales, "noise": args.noise, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
