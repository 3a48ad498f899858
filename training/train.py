"""Train the ``strata_jdd_v1`` enhancement network and write its model packages.

    python -m training.train --photos ../shared/data/photos --minutes 12 --device cuda \\
        --out services/pipeline/models/packages/ --seed 0
    python -m training.train --smoke --out /tmp/pkg      # CPU, 20 steps, tiny crops (tests)

Batches are synthesised on the training device from natural content (:mod:`training.data`). Loss: L1 between
the output and the clean target after the sample's camera matrix and the sRGB transfer (what a viewer sees).
AdamW, linear warm-up then cosine decay, bf16 autocast on CUDA. Without ``--steps`` the step count is fixed
after a short timing probe so the run fits ``--minutes``; the chosen count is logged (pass it as ``--steps``
to repeat the run exactly). At the end the network is evaluated on held-out crops at every noise level
against the classical package, the log and a JSON of metrics go to ``--log-dir``, and the packages are written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from services.pipeline.models import jdd
from services.pipeline.models.classical import ClassicalEnhancer
from services.pipeline.models.jdd import JDDEnhancer, JDDNet, residual_full_res
from services.pipeline.models.package import write_package
from services.pipeline.ops import demosaic_bilinear
from training import data
from training.packages import (
    CAMERA_DEFAULTS,
    LEARNED_PACKAGES,
    classical_manifest,
    jdd_manifest,
    write_learned_packages,
)

log = logging.getLogger("training")
PROBE_STEPS = 30


def srgb_view(rgb: Tensor, cam_to_rgb: Tensor) -> Tensor:
    """White-balanced camera RGB (B, 3, H, W) -> sRGB-encoded in [0, 1], differentiable everywhere."""
    x = data.apply_matrix_batch(rgb, cam_to_rgb).clamp(0.0, 1.0)
    return torch.where(x <= 0.0031308, x * 12.92, x.clamp(min=0.0031308).pow(1.0 / 2.4) * 1.055 - 0.055)


def psnr(a: Tensor, b: Tensor) -> Tensor:
    """Per-image PSNR (B,) of values in [0, 1]."""
    mse = ((a - b) ** 2).flatten(1).mean(dim=1).clamp(min=1e-12)
    return -10.0 * torch.log10(mse)


def predict(net: JDDNet, batch: data.RawBatch, margin: int, autocast: bool) -> Tensor:
    """Training forward: RGGB canvas -> (B, 3, H - 2 margin, W - 2 margin) white-balanced RGB."""
    with torch.autocast(batch.mosaic.device.type, dtype=torch.bfloat16, enabled=autocast):
        residual = residual_full_res(net, batch.mosaic, batch.shot, batch.read)
    base = demosaic_bilinear(batch.mosaic, "RGGB")[..., margin:-margin, margin:-margin]
    return base + residual.float()


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.02 + 0.98 * 0.5 * (1.0 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(net: JDDNet, config: dict[str, Any], sets: dict[str, list[data.RawBatch]], device: torch.device,
             precision: str) -> dict[str, dict[str, float]]:
    """Mean PSNR (sRGB view) per noise level of the network (through the real :class:`JDDEnhancer` path, all
    four CFA phases) and of the classical package."""
    net.eval()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[precision]
    model = JDDEnhancer(jdd_manifest("eval", ("*",), config, {}), net, device, dtype)
    classical = ClassicalEnhancer(classical_manifest(), device)
    out: dict[str, dict[str, float]] = {}
    for level, batches in sets.items():
        scores: dict[str, list[Tensor]] = {"model": [], "classical": [], "bilinear": []}
        for b in batches:
            target = srgb_view(b.target, b.cam_to_rgb)
            for name, enh in (("model", model), ("classical", classical)):
                rgb = torch.stack([enh.enhance(b.mosaic[i : i + 1], b.cfa, b.shot[i], b.read[i])[0]
                                   for i in range(b.mosaic.shape[0])])
                scores[name].append(psnr(srgb_view(rgb, b.cam_to_rgb), target))
            scores["bilinear"].append(psnr(srgb_view(demosaic_bilinear(b.mosaic, b.cfa), b.cam_to_rgb), target))
        out[level] = {k: float(torch.cat(v).mean()) for k, v in scores.items()}
        out[level]["gain_db"] = out[level]["model"] - out[level]["classical"]
    for p in net.parameters():  # the enhancer wrapper froze the shared parameters for inference
        p.requires_grad_(True)
    net.train()
    return out


def _setup_logging(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    log.setLevel(logging.INFO)
    log.handlers.clear()
    for h in (logging.FileHandler(log_path, mode="w"), logging.StreamHandler()):
        h.setFormatter(fmt)
        log.addHandler(h)


def _seed_everything(seed: int, device: torch.device) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return torch.Generator(device=device).manual_seed(seed)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--photos", default="../shared/data/photos", help="directory of the training photographs")
    p.add_argument("--minutes", type=float, default=12.0, help="training time budget (without --steps)")
    p.add_argument("--steps", type=int, default=None, help="exact number of steps (overrides --minutes)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="services/pipeline/models/packages", help="where packages are written")
    p.add_argument("--log-dir", default=None, help="log + metrics JSON (default docs/training; smoke: --out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--crop", type=int, default=128, help="target crop (full-res pixels, even)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--width", type=int, default=jdd.DEFAULT_CONFIG["width"])
    p.add_argument("--dilations", default=",".join(str(d) for d in jdd.DEFAULT_CONFIG["dilations"]))
    p.add_argument("--eval-every", type=int, default=2000)
    p.add_argument("--smoke", action="store_true", help="CPU, 20 steps, tiny crops; writes a *-smoke package")
    p.add_argument("--ship-anyway", action="store_true",
                   help="write the camera default packages even if the model loses to classical somewhere")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.steps, args.batch, args.crop = "cpu", args.steps or 20, min(args.batch, 4), 32
        args.width, args.dilations = min(args.width, 16), "1,1"
    return args


def _optimise(net: JDDNet, source: data.TrainingSource, eval_sets: Any, config: dict[str, Any],
              args: argparse.Namespace, gen: torch.Generator) -> tuple[int, list[dict[str, Any]], float]:
    """The training loop (time-budgeted unless ``--steps``); returns (steps, loss history, seconds)."""
    device = next(net.parameters()).device
    cuda = device.type == "cuda"
    margin = 2 * net.radius
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4, betas=(0.9, 0.99))
    total = args.steps or 10**9
    warmup = min(500, max(1, total // 10))
    history: list[dict[str, Any]] = []
    t_train = time.time()
    step = 0
    while step < total:
        if args.steps is None and step == PROBE_STEPS:
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.time() - t_train) / PROBE_STEPS
            total = max(PROBE_STEPS + 1, int(args.minutes * 60.0 / per_step))
            log.info("timing probe: %.1f ms/step -> %d steps for %.1f min", per_step * 1e3, total, args.minutes)
        lr = lr_at(step, total, args.lr, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = data.training_batch(source, args.batch, args.crop, margin, gen)
        if cuda:
            batch.mosaic = batch.mosaic.contiguous(memory_format=torch.channels_last)
        out = predict(net, batch, margin, autocast=cuda)
        loss = F.l1_loss(srgb_view(out, batch.cam_to_rgb), srgb_view(batch.target, batch.cam_to_rgb))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loss = loss.detach()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 500 == 0 or step == total:
            log.info("step %d/%d lr %.2e loss %.5f (%.0f s)", step, total, lr, loss.item(), time.time() - t_train)
            history.append({"step": step, "loss": loss.item(), "lr": lr, "seconds": time.time() - t_train})
        if args.eval_every and step % args.eval_every == 0 and step < total:
            log.info("eval at %d: %s", step, json.dumps(evaluate(net, config, eval_sets, device, "float32")))
    return step, history, time.time() - t_train


def _training_record(args: argparse.Namespace, source: data.TrainingSource, steps: int, train_s: float,
                     metrics: dict[str, Any]) -> dict[str, Any]:
    """How the package was made, written into its manifest and the metrics JSON."""
    return {
        "script": "training/train.py",
        "command": "python -m training.train " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, False, True)),
        "seed": args.seed,
        "steps": steps,
        "batch": args.batch,
        "crop": args.crop,
        "train_seconds": round(train_s, 1),
        "data": {"recipe": "training/data.py (Brooks 2019 unprocess, Poisson-Gaussian noise, clipping)",
                 "content": source.describe(), "held_out_photos": list(data.HELD_OUT_PHOTOS),
                 "held_out_dead_leaves_seeds": [data.DEAD_LEAVES_HELD_OUT_SEEDS.start,
                                                data.DEAD_LEAVES_HELD_OUT_SEEDS.stop]},
        "held_out_psnr": metrics["float32"],
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "smoke": bool(args.smoke),
    }


def _write_packages(net: JDDNet, config: dict[str, Any], args: argparse.Namespace, training: dict[str, Any],
                    beats: bool) -> list[Path]:
    """The smoke package, or the learned packages (camera defaults only if the model beats classical)."""
    if args.smoke:
        smoke_path = Path(args.out) / f"{jdd.ARCHITECTURE}-smoke.strata"
        write_package(smoke_path, jdd_manifest(f"{jdd.ARCHITECTURE}-smoke", ("*",), config, training),
                      {k: v.detach() for k, v in net.state_dict().items()})
        return [smoke_path]
    files = list(LEARNED_PACKAGES)
    if not beats and not args.ship_anyway:
        files = [f for f in files if f not in CAMERA_DEFAULTS]
        log.warning("the model does not beat classical at every noise level: camera defaults not written")
    return write_learned_packages(net, config, args.out, training, files)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run one training; returns the metrics written to the JSON."""
    device = torch.device(args.device)
    config = {"width": args.width, "dilations": [int(d) for d in args.dilations.split(",")]}
    run = f"{jdd.ARCHITECTURE}-seed{args.seed}" + ("-smoke" if args.smoke else "")
    log_dir = Path(args.log_dir or (args.out if args.smoke else "docs/training"))
    _setup_logging(log_dir / f"{run}.log")
    gen = _seed_everything(args.seed, device)
    net = JDDNet(config["width"], config["dilations"]).to(device)
    cuda = device.type == "cuda"
    if cuda:
        net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    params = sum(p.numel() for p in net.parameters())
    log.info("run %s: config %s, %d parameters, rf %d, %.0f FLOPs/pixel, torch %s on %s", run, config, params,
             jdd.jdd_receptive_field(config), jdd.flops_per_pixel(config), torch.__version__, device)
    t0 = time.time()
    dl_pool, dl_size = (4, 96) if args.smoke else (48, 384)
    source = data.TrainingSource(args.photos, device, args.seed, dead_leaves_pool=dl_pool, dead_leaves_size=dl_size)
    eval_sets = data.held_out_batches(args.photos, device, size=64 if args.smoke else 192,
                                      per_photo=1 if args.smoke else 2, dead_leaves_count=2 if args.smoke else 8)
    log.info("content %s, held-out sets ready in %.1f s", source.describe(), time.time() - t0)
    steps, history, train_s = _optimise(net, source, eval_sets, config, args, gen)
    metrics = {p: evaluate(net, config, eval_sets, device, p) for p in (["float32", "bfloat16"] if cuda
                                                                         else ["float32"])}
    for p, m in metrics.items():
        for level, v in m.items():
            log.info("held-out %-4s %-8s model %.2f dB  classical %.2f dB  bilinear %.2f dB  gain %+.2f dB",
                     level, p, v["model"], v["classical"], v["bilinear"], v["gain_db"])
    beats = all(v["gain_db"] > 0 for v in metrics["float32"].values())
    training = _training_record(args, source, steps, train_s, metrics)
    written = _write_packages(net, config, args, training, beats)
    for path in written:
        log.info("wrote %s (%d bytes)", path, path.stat().st_size)
    result = {"run": run, "config": config, "parameters": params, "flops_per_pixel": jdd.flops_per_pixel(config),
              "receptive_field": jdd.jdd_receptive_field(config), "history": history, "metrics": metrics,
              "beats_classical": beats, "packages": [str(path) for path in written], **training}
    (log_dir / f"{run}.json").write_text(json.dumps(result, indent=2) + "\n")
    log.info("done in %.1f s (training %.1f s)", time.time() - t0, train_s)
    return result


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
