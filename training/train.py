"""Train the ``strata_jdd_v1`` enhancement network and write its model packages.

    python -m training.train --photos ../shared/data/photos --minutes 12 --device cuda \\
        --out services/pipeline/models/packages/ --seed 0
    python -m training.train --smoke --out /tmp/pkg      # CPU, 20 steps, tiny crops (tests)
    python -m training.train --package v2 --photos ../shared/data/photos --steps 20000 --device cuda \
        --stop-after 8.5 --checkpoint .ckpt/v2.pt     # the `best` package; run again with --resume to finish

Batches are synthesised on the training device from natural content (:mod:`training.data`). Loss: L1 between
the output and the clean target after the sample's camera matrix and the sRGB transfer (what a viewer sees).
AdamW, linear warm-up then cosine decay, bf16 autocast on CUDA. Without ``--steps`` the step count is fixed
after a short timing probe so the run fits ``--minutes``; the chosen count is logged (pass it as ``--steps``
to repeat the run exactly). At the end the network is evaluated on held-out crops at every noise level
against the classical package, the log and a JSON of metrics go to ``--log-dir``, and the packages are written.

``--package v1`` (default) writes the `fast` packages (``strata_jdd_v1`` and the camera defaults it was
shipped as); ``--package v2`` the `best` one, ``strata_jdd_v2.strata``: a larger network of the same family
(:data:`PACKAGE_DEFAULTS`), data recipe v2 (:mod:`training.data`), also scored on scikit-image's photographs,
a source it never trained on. ``--stop-after MINUTES`` with ``--checkpoint`` saves the run part-way and
``--resume`` continues it (the device lends 10-minute calls).

``--package frames`` trains ``strata_jdd_v2_frames.strata``, the package of a stack's frames' model pass
(:func:`services.pipeline.models.registry.frames_package`), for what a stack needs of it: each step renders stacks
of 2, 4 or 8 frames of one scene (each frame its own noise, moved by a whole pixel or not, told the share of its
noise the merge tells it) and scores the average of a stack's renders against the truth. Scored on held-out
stacks (4 and 8 frames, mid noise) against the ``--init`` package; usually run from the shipped one:
``--package frames --init strata_jdd_v2_frames.strata --version 2.2.0 --steps 12000 --lr 2e-4``. With
``--subpixel`` the frames also move by fractions of a pixel and each render is warped back by the merge's Lanczos-5
before the average (tried in session 48, not shipped: docs/training/README.md).
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
from services.pipeline.models.base import Enhancer
from services.pipeline.models.classical import ClassicalEnhancer
from services.pipeline.models.jdd import JDDEnhancer, JDDNet, residual_full_res
from services.pipeline.models.package import write_package
from services.pipeline.models.registry import resolve_package
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
# Per package: data recipe, network config, crop, batch and learning rate unless given on the command line.
PACKAGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "v1": {"recipe": "v1", "width": jdd.DEFAULT_CONFIG["width"],
           "dilations": ",".join(str(d) for d in jdd.DEFAULT_CONFIG["dilations"]), "crop": 128, "batch": 32,
           "lr": 2e-3},
    "v2": {"recipe": "v2", "width": 64, "dilations": "1,1,2,3,3,2,1,1", "crop": 160, "batch": 24, "lr": 1.5e-3},
    # batch: frames per step (in stacks of STACK_SIZES)
    "frames": {"recipe": "v2", "width": 64, "dilations": "1,1,2,3,3,2,1,1", "crop": 128, "batch": 32, "lr": 2e-4},
}
V2_PACKAGE = "strata_jdd_v2.strata"
V2_VERSION = "2.0.0"
FRAMES_PACKAGE = "strata_jdd_v2_frames.strata"
FRAMES_VERSION = "2.2.0"
STACK_SIZES = (2, 4, 8)  # a frames step draws one of these


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
             precision: str, others: dict[str, Enhancer] | None = None) -> dict[str, dict[str, float]]:
    """Mean PSNR (sRGB view) per noise level of the network (through the real :class:`JDDEnhancer` path, all
    four CFA phases), of the classical package and of ``others`` (name -> enhancer, e.g. a shipped package)."""
    net.eval()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[precision]
    model = JDDEnhancer(jdd_manifest("eval", ("*",), config, {}), net, device, dtype)
    enhancers: dict[str, Enhancer] = {"model": model, "classical": ClassicalEnhancer(classical_manifest(), device),
                                      **(others or {})}
    out: dict[str, dict[str, float]] = {}
    for level, batches in sets.items():
        scores: dict[str, list[Tensor]] = {name: [] for name in (*enhancers, "bilinear")}
        for b in batches:
            target = srgb_view(b.target, b.cam_to_rgb)
            for name, enh in enhancers.items():
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


def _setup_logging(log_path: Path, append: bool = False) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    log.setLevel(logging.INFO)
    log.handlers.clear()
    for h in (logging.FileHandler(log_path, mode="a" if append else "w"), logging.StreamHandler()):
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
    p.add_argument("--package", choices=sorted(PACKAGE_DEFAULTS), default="v1",
                   help="v1: the fast packages; v2: strata_jdd_v2, the best package; frames: the stacks' frames' "
                   "package, trained on stacks")
    p.add_argument("--recipe", choices=sorted(data.RECIPES), default=None, help="data recipe (default: the package's)")
    p.add_argument("--hard-share", type=float, default=None,
                   help="share of crops of procedural hard content (training/patterns.py), the recipe's other "
                   "sources scaled to make room (recipe patterns: 0.15)")
    p.add_argument("--hard-min-period", type=float, default=None,
                   help="shortest period of the hard content's gratings and checkerboards, 2-4 px (default 2; 3 "
                   "leaves out the 2-px patterns that alias with saturated colours)")
    p.add_argument("--hard-hue-share", type=float, default=None,
                   help="share of the hard scenes drawn as fine texture in one saturated hue at two shades (dot "
                   "grids, twills, 1-px grain; default 0): the truth of saturated green or cyan fine texture")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--crop", type=int, default=None, help="target crop (full-res pixels, even)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--dilations", default=None, help="comma-separated dilations of the residual blocks")
    p.add_argument("--eval-every", type=int, default=2000)
    p.add_argument("--stop-after", type=float, default=None,
                   help="minutes after which to save --checkpoint and stop (finish later with --resume)")
    p.add_argument("--checkpoint", default=None, help="where --stop-after saves the run")
    p.add_argument("--resume", default=None, help="a checkpoint to continue")
    p.add_argument("--init", default=None,
                   help="start from this package's weights (fine-tuning; its config must match the run's)")
    p.add_argument("--version", default=None,
                   help=f"the written package's version (v2: default {V2_VERSION}; frames: {FRAMES_VERSION})")
    p.add_argument("--subpixel", action="store_true",
                   help="frames: stacks whose frames also move by random fractions of a pixel, each render warped "
                   "back by the service's Lanczos-5 before the average (training and held-out stacks)")
    p.add_argument("--smoke", action="store_true", help="CPU, 20 steps, tiny crops; writes a *-smoke package")
    p.add_argument("--ship-anyway", action="store_true",
                   help="write the camera default packages even if the model loses to classical somewhere")
    args = p.parse_args(argv)
    for key, value in PACKAGE_DEFAULTS[args.package].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.stop_after is not None and not args.checkpoint:
        p.error("--stop-after needs --checkpoint")
    if args.smoke:
        args.device, args.steps, args.batch, args.crop = "cpu", args.steps or 20, min(args.batch, 4), 32
        args.width, args.dilations = min(args.width, 16), "1,1"
    return args


def _save_checkpoint(path: str, net: JDDNet, opt: torch.optim.Optimizer, source: data.TrainingSource,
                     gen: torch.Generator, step: int, total: int, history: list[dict[str, Any]],
                     seconds: float) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step, "total": total, "history": history,
                "seconds": seconds, "gen": gen.get_state(), "source_rng": source.rng.bit_generator.state,
                "torch_rng": torch.get_rng_state()}, path)
    log.info("checkpoint at step %d/%d saved to %s", step, total, path)


def _optimise(net: JDDNet, source: data.TrainingSource, eval_sets: Any, config: dict[str, Any],
              args: argparse.Namespace, gen: torch.Generator) -> tuple[int, list[dict[str, Any]], float, bool]:
    """The training loop (time-budgeted unless ``--steps``); returns (steps, loss history, seconds, finished):
    not finished when ``--stop-after`` saved a checkpoint part-way."""
    device = next(net.parameters()).device
    cuda = device.type == "cuda"
    margin = 2 * net.radius
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4, betas=(0.9, 0.99))
    total = args.steps or 10**9
    history: list[dict[str, Any]] = []
    step, before = 0, 0.0
    if args.resume:
        state = torch.load(args.resume, map_location=device, weights_only=False)
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        step, total, history, before = state["step"], state["total"], state["history"], state["seconds"]
        gen.set_state(state["gen"])
        source.rng.bit_generator.state = state["source_rng"]
        torch.set_rng_state(state["torch_rng"])
        log.info("resumed %s at step %d/%d (%.0f s trained)", args.resume, step, total, before)
    warmup = min(500, max(1, total // 10))
    t_train = time.time() - before
    t_call = time.time()
    first = step
    while step < total:
        if args.steps is None and step == PROBE_STEPS:
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.time() - t_train) / PROBE_STEPS
            total = max(PROBE_STEPS + 1, int(args.minutes * 60.0 / per_step))
            log.info("timing probe: %.1f ms/step -> %d steps for %.1f min", per_step * 1e3, total, args.minutes)
        if args.stop_after is not None and step > first and time.time() - t_call > args.stop_after * 60.0:
            _save_checkpoint(args.checkpoint, net, opt, source, gen, step, total, history, time.time() - t_train)
            return step, history, time.time() - t_train, False
        lr = lr_at(step, total, args.lr, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = _step_loss(net, source, args, margin, gen, cuda)
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
    return step, history, time.time() - t_train, True


def _step_loss(net: JDDNet, source: data.TrainingSource, args: argparse.Namespace, margin: int,
               gen: torch.Generator, cuda: bool) -> Tensor:
    """One step's loss: a batch of single frames, or (``--package frames``) of stacks, their frames' renders
    averaged (:func:`stack_render`) against the truth."""
    if args.package == "frames":
        count = STACK_SIZES[int(torch.randint(len(STACK_SIZES), (1,), generator=gen, device=gen.device))]
        stacks = data.training_stack_batch(source, args.batch, args.crop, margin, gen, count, subpixel=args.subpixel)
        view = stacks.raw.cam_to_rgb[:: stacks.frames]
        return F.l1_loss(srgb_view(stack_render(net, stacks, margin, cuda), view), srgb_view(stacks.target, view))
    batch = data.training_batch(source, args.batch, args.crop, margin, gen)
    if cuda:
        batch.mosaic = batch.mosaic.contiguous(memory_format=torch.channels_last)
    out = predict(net, batch, margin, autocast=cuda)
    return F.l1_loss(srgb_view(out, batch.cam_to_rgb), srgb_view(batch.target, batch.cam_to_rgb))


def stack_render(net: JDDNet, stacks: data.StackBatch, margin: int, autocast: bool) -> Tensor:
    """A stack batch's frames rendered (:func:`predict`) and averaged over the square they share: (stacks, 3,
    S - 1, S - 1), what the merge makes of perfectly aligned frames."""
    raw = stacks.raw
    if autocast:
        raw.mosaic = raw.mosaic.contiguous(memory_format=torch.channels_last)
    return data.aligned(predict(net, raw, margin, autocast), stacks).mean(dim=1)


@torch.no_grad()
def evaluate_stacks(nets: dict[str, JDDNet], sets: dict[str, data.StackBatch], margin: int
                    ) -> dict[str, dict[str, float]]:
    """Mean PSNR (sRGB view) of each net's averaged stack renders per held-out stack set (float32)."""
    out: dict[str, dict[str, float]] = {}
    for name, stacks in sets.items():
        view = stacks.raw.cam_to_rgb[:: stacks.frames]
        truth = srgb_view(stacks.target, view).clamp(0, 1)
        out[name] = {}
        for label, net in nets.items():
            was_training = net.training
            net.eval()
            got = srgb_view(stack_render(net, stacks, margin, autocast=False), view).clamp(0, 1)
            net.train(was_training)
            out[name][label] = float(psnr(got, truth).mean())
    return out


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
    """The smoke package, the v2 package, or the v1 learned packages (camera defaults only if the model beats
    classical)."""
    weights = {k: v.detach() for k, v in net.state_dict().items()}
    if args.smoke:
        smoke_path = Path(args.out) / f"{jdd.ARCHITECTURE}-smoke.strata"
        write_package(smoke_path, jdd_manifest(f"{jdd.ARCHITECTURE}-smoke", ("*",), config, training), weights)
        return [smoke_path]
    if args.package in ("v2", "frames"):
        file, version = (V2_PACKAGE, V2_VERSION) if args.package == "v2" else (FRAMES_PACKAGE, FRAMES_VERSION)
        if not beats and not args.ship_anyway:
            log.warning("the model does not beat %s: %s not written",
                        "classical at every noise level" if args.package == "v2" else "--init on the stacks", file)
            return []
        path = Path(args.out) / file
        write_package(path, jdd_manifest(path.stem, ("*",), config, training, version=args.version or version),
                      weights)
        return [path]
    files = list(LEARNED_PACKAGES)
    if not beats and not args.ship_anyway:
        files = [f for f in files if f not in CAMERA_DEFAULTS]
        log.warning("the model does not beat classical at every noise level: camera defaults not written")
    return write_learned_packages(net, config, args.out, training, files)


@torch.no_grad()
def median_enhance_seconds(model: Enhancer, mosaic: Tensor, runs: int = 4) -> float:
    """Median seconds of ``model.enhance(mosaic)`` on CUDA, the first (warm-up) run left out."""
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.enhance(mosaic, "RGGB", [1e-3] * 3, [1e-5] * 3)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times[1:]))


@torch.no_grad()
def time_enhance(net: JDDNet, config: dict[str, Any], device: torch.device, megapixels: float) -> dict[str, float]:
    """Median seconds of one enhance of a ``megapixels`` frame (bf16 and TF32), as a worker runs it."""
    side = int(math.sqrt(megapixels * 1e6 / 1.333)) // 2 * 2
    mosaic = torch.rand(1, 1, side, int(side * 1.333) // 2 * 2, device=device)
    out: dict[str, float] = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32+tf32", torch.float32)):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        out[name] = median_enhance_seconds(JDDEnhancer(jdd_manifest("timing", ("*",), config, {}), net, device,
                                                       dtype), mosaic)
    for p in net.parameters():
        p.requires_grad_(True)
    net.train()
    return out


def _log_metrics(title: str, metrics: dict[str, dict[str, dict[str, float]]]) -> None:
    for p, m in metrics.items():
        for level, v in m.items():
            extra = "".join(f"  {k} {x:.2f} dB" for k, x in v.items() if k not in ("model", "classical", "bilinear",
                                                                                   "gain_db"))
            log.info("%s %-4s %-8s model %.2f dB  classical %.2f dB  bilinear %.2f dB  gain %+.2f dB%s", title, level,
                     p, v["model"], v["classical"], v["bilinear"], v["gain_db"], extra)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run one training (or a part of one, with ``--stop-after``); returns the metrics written to the JSON."""
    device = torch.device(args.device)
    config = {"width": args.width, "dilations": [int(d) for d in args.dilations.split(",")]}
    name = {"v1": jdd.ARCHITECTURE, "v2": Path(V2_PACKAGE).stem, "frames": Path(FRAMES_PACKAGE).stem}[args.package]
    run = f"{name}-seed{args.seed}" + (f"-{args.recipe}-ft" if args.init else "") + ("-smoke" if args.smoke else "")
    log_dir = Path(args.log_dir or (args.out if args.smoke else "docs/training"))
    _setup_logging(log_dir / f"{run}.log", append=bool(args.resume))
    gen = _seed_everything(args.seed, device)
    net = JDDNet(config["width"], config["dilations"]).to(device)
    cuda = device.type == "cuda"
    if cuda:
        net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if args.init and not args.resume:
        _load_init(net, args.init, config)
    params = sum(p.numel() for p in net.parameters())
    log.info("run %s: config %s, recipe %s, %d parameters, rf %d, %.0f FLOPs/pixel, torch %s on %s", run, config,
             args.recipe, params, jdd.jdd_receptive_field(config), jdd.flops_per_pixel(config), torch.__version__,
             device)
    t0 = time.time()
    dl_pool, dl_size = (4, 96) if args.smoke else (48, 384)
    recipe = data.RECIPES[args.recipe]
    if args.hard_share is not None:
        recipe = data.with_hard_share(recipe, args.hard_share)
    if args.hard_min_period is not None:
        recipe = data.with_hard_min_period(recipe, args.hard_min_period)
    if args.hard_hue_share is not None:
        recipe = data.with_hard_hue_share(recipe, args.hard_hue_share)
    source = data.TrainingSource(args.photos, device, args.seed, dead_leaves_pool=dl_pool, dead_leaves_size=dl_size,
                                 recipe=recipe)
    eval_sets = data.held_out_batches(args.photos, device, size=64 if args.smoke else 192,
                                      per_photo=1 if args.smoke else 2, dead_leaves_count=2 if args.smoke else 8)
    log.info("content %s, held-out sets ready in %.1f s", source.describe(), time.time() - t0)
    steps, history, train_s, finished = _optimise(net, source, eval_sets, config, args, gen)
    if not finished:
        log.info("stopped after %.1f min at step %d: continue with --resume %s", args.stop_after, steps,
                 args.checkpoint)
        return {"run": run, "steps": steps, "finished": False, "checkpoint": args.checkpoint}
    metrics, other, stacks, beats = _final_metrics(net, config, args, device, eval_sets)
    training = _training_record(args, source, steps, train_s, metrics)
    if stacks:
        training["held_out_stacks_psnr"] = stacks
    if other:
        training["held_out_other_source_psnr"] = other["float32"]
    timing = time_enhance(net, config, device, 80.0) if cuda else {}
    if timing:
        log.info("enhance of an 80 MP frame on %s: %s", torch.cuda.get_device_name(device), timing)
        training["enhance_80mp_seconds"] = timing
    written = _write_packages(net, config, args, training, beats)
    for path in written:
        log.info("wrote %s (%d bytes)", path, path.stat().st_size)
    result = {"run": run, "config": config, "parameters": params, "flops_per_pixel": jdd.flops_per_pixel(config),
              "receptive_field": jdd.jdd_receptive_field(config), "history": history, "metrics": metrics,
              "other_source": other, "beats_classical": beats, "packages": [str(path) for path in written],
              "finished": True, **training}
    (log_dir / f"{run}.json").write_text(json.dumps(result, indent=2) + "\n")
    log.info("done in %.1f s (training %.1f s)", time.time() - t0, train_s)
    return result


def _final_metrics(net: JDDNet, config: dict[str, Any], args: argparse.Namespace, device: torch.device,
                   eval_sets: dict[str, list[data.RawBatch]]) -> tuple[dict, dict, dict, bool]:
    """The finished run scored: held-out sets (float32, and bfloat16 on CUDA), other-origin sets, stacks (the frames'
    package), and whether it may ship (beats classical at every level; frames: the --init package on the stacks)."""
    others = _shipped_references(args, device)
    metrics = {p: evaluate(net, config, eval_sets, device, p, others) for p in (["float32", "bfloat16"]
                                                                                 if device.type == "cuda"
                                                                                 else ["float32"])}
    _log_metrics("held-out", metrics)
    other_sets = {} if args.smoke else data.held_out_other_source(device)
    other = {"float32": evaluate(net, config, other_sets, device, "float32", others)} if other_sets else {}
    _log_metrics("other source (scikit-image)", other)
    beats = all(v["gain_db"] > 0 for v in metrics["float32"].values())
    stacks = _stack_metrics(net, config, args, device) if args.package == "frames" else {}
    if stacks:
        beats = "init" not in next(iter(stacks.values())) or all(v["model"] >= v["init"] for v in stacks.values())
    return metrics, other, stacks, beats


def _stack_metrics(net: JDDNet, config: dict[str, Any], args: argparse.Namespace, device: torch.device
                   ) -> dict[str, dict[str, float]]:
    """The frames' package scored on held-out stacks (mid noise, 4 and 8 frames) beside the ``--init`` package."""
    margin = 2 * net.radius
    sets = data.held_out_stacks(args.photos, device, margin, size=32 if args.smoke else 128,
                                per_photo=1 if args.smoke else 2, subpixel=args.subpixel)
    nets = {"model": net}
    if args.init:
        nets["init"] = JDDNet(config["width"], config["dilations"]).to(device)
        _load_init(nets["init"], args.init, config)
    stacks = evaluate_stacks(nets, sets, margin)
    for name, v in stacks.items():
        log.info("held-out stacks %-9s %s", name, "  ".join(f"{k} {x:.2f} dB" for k, x in v.items()))
    return stacks


def _load_init(net: JDDNet, package: str, config: dict[str, Any]) -> None:
    """Copy a package's weights into ``net`` (``--init``): the start of a fine-tuning run."""
    from services.pipeline.models.package import read_package

    pkg = read_package(resolve_package(package))
    if pkg.weights is None or pkg.manifest.config != config:
        raise SystemExit(f"--init {package}: config {pkg.manifest.config} does not match the run's {config}")
    net.load_state_dict({k: v.to(next(net.parameters()).device) for k, v in pkg.weights.items()})
    log.info("initialised from %s %s", pkg.source, pkg.manifest.version)


def _shipped_references(args: argparse.Namespace, device: torch.device) -> dict[str, Enhancer]:
    """The shipped v1 package (and the --init package), scored beside a v2 run on the same sets."""
    if args.package == "v1" or args.smoke:
        return {}
    from services.pipeline.models import load_package

    refs = {"strata_jdd_v1": load_package(resolve_package("strata_jdd_v1.strata"), device, precision="float32")}
    if args.init:
        refs["init"] = load_package(resolve_package(args.init), device, precision="float32")
    return refs


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
