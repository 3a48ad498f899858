"""Pipeline speed benchmark: the real stage functions the workers call, timed stage by stage.

It runs the coordinator's and GPU workers' code paths in one process (one thread per GPU, shards pulled from
a shared list like the shared `gpu` queue), without HTTP or Redis, so the numbers are the pipeline's own.
Frames are procedural (content does not change the work), written as real DNGs and decoded by LibRaw in the
sandboxed child process, as in production.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.args import positive_float, torch_devices
from services.jobs.planner import plan_frame_groups, plan_strips, strip_count
from services.pipeline.render import render_strip
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import merge_frame_group, render_stack_strip
from services.raw.decode import decode_raw
from services.raw.dng import write_dng
from services.raw.meta import RawMeta
from services.storage.local import LocalStorage

CM = np.array([[0.8462, -0.2418, -0.0648], [-0.4766, 1.2633, 0.2307], [-0.1219, 0.2079, 0.6556]])
NEUTRAL = (0.52, 1.0, 0.71)


def _sync(devices: list[str]) -> None:
    for d in devices:
        if d.startswith("cuda"):
            torch.cuda.synchronize(d)


@dataclass
class Timer:
    stages: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], Any], devices: list[str] | None = None) -> Any:
        _sync(devices or [])
        t0 = time.perf_counter()
        out = fn()
        _sync(devices or [])
        self.stages[name] = time.perf_counter() - t0
        return out


def procedural_mosaic(height: int, width: int, seed: int, shift: tuple[float, float] = (0.0, 0.0),
                      noise_seed: int | None = None) -> np.ndarray:
    """A (H, W) uint16 Bayer mosaic of smooth random colour structure plus fine texture and noise; ``noise_seed``
    (default ``seed``) draws the noise, so a stack's frames are separate exposures (the service refuses one file
    sent twice in a stack)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand((1, 3, height // 32 + 2, width // 32 + 2), generator=g)
    img = torch.nn.functional.interpolate(low, size=(height + 8, width + 8), mode="bilinear", align_corners=False)
    dy, dx = int(round(shift[0])), int(round(shift[1]))
    img = img[:, :, 4 - dy:4 - dy + height, 4 - dx:4 - dx + width]  # [1, 3, H, W]
    mosaic = torch.empty((height, width))
    mosaic[0::2, 0::2] = img[0, 0, 0::2, 0::2] * NEUTRAL[0]
    mosaic[0::2, 1::2] = img[0, 1, 0::2, 1::2]
    mosaic[1::2, 0::2] = img[0, 1, 1::2, 0::2]
    mosaic[1::2, 1::2] = img[0, 2, 1::2, 1::2] * NEUTRAL[2]
    noise = g if noise_seed is None else torch.Generator().manual_seed(noise_seed)
    mosaic = (mosaic * 0.8 + 0.01 * torch.rand((height, width), generator=noise)).clamp(0, 1)
    return (1024 + mosaic.numpy() * (65535 - 1024)).astype(np.uint16)


def write_frame(path: Path, mosaic: np.ndarray, model: str) -> None:
    from services.raw.colour import CameraProfile
    from services.raw.meta import NoiseProfile

    write_dng(path, mosaic, cfa="RGGB", black_level=1024, white_level=65535, profile=CameraProfile(CM),
              as_shot_neutral=NEUTRAL, make="Phase One", model=model, noise_profile=NoiseProfile(2e-4, 1e-7))


def write_stack_frames(tmp: Path, frames: int, height: int, width: int) -> list[Path]:
    """An IQ2_XS-style stack's DNGs in ``tmp``: frame 0 unshifted, the others shifted at random by up to 1.5 px (the
    same shifts for the same count: seed 5)."""
    rng = np.random.default_rng(5)
    paths = []
    for k in range(frames):
        shift = (0.0, 0.0) if k == 0 else tuple(float(v) for v in rng.uniform(-1.5, 1.5, 2))
        path = tmp / f"iq2xs_{k:02d}.dng"
        write_frame(path, procedural_mosaic(height, width, 7, shift), "IQ2_XS")  # type: ignore[arg-type]
        paths.append(path)
    return paths


def _gpu_pool(devices: list[str], jobs: list[Callable[[str], Any]]) -> list[Any]:
    """Run jobs on devices the way the shared GPU queue does: each device's worker pulls the next job."""
    todo: queue.Queue[tuple[int, Callable[[str], Any]]] = queue.Queue()
    for item in enumerate(jobs):
        todo.put(item)
    results: list[Any] = [None] * len(jobs)

    def worker(device: str) -> None:
        while True:
            try:
                i, job = todo.get_nowait()
            except queue.Empty:
                return
            results[i] = job(device)

    threads = [threading.Thread(target=worker, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _sync(devices)
    return results


def _decode_all(paths: list[Path], tmp: Path) -> tuple[list[np.ndarray], list[RawMeta]]:
    def one(i: int) -> tuple[np.ndarray, RawMeta]:
        out = tmp / f"raw_{i:02d}.npy"
        meta = decode_raw(paths[i], out)
        return np.load(out, mmap_mode="r"), meta

    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        pairs = list(pool.map(one, range(len(paths))))
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _encode(image: np.ndarray, tmp: Path, threads: int) -> int:
    from services.export.tiff import write_tiff

    storage = LocalStorage(tmp)
    _, size = write_tiff(storage, f"out_{threads}.tif", image, threads=threads)
    return size


def bench_single_frame(devices: list[str], height: int, width: int, tmp: Path, tiff_threads: int) -> dict:
    """IQ3_S-style frame: decode → shared params → strips on the GPUs → stitch → 16-bit TIFF."""
    t = Timer()
    path = tmp / "iq3s.dng"
    write_frame(path, procedural_mosaic(height, width, 1), "IQ3_S")
    _decode_all([path], tmp)  # warm-up, as for the stack
    time.sleep(1.0)
    (mosaics, metas) = t.run("decode (LibRaw child)", lambda: _decode_all([path], tmp))
    params = t.run("shot params (WB, noise, colour)", lambda: shot_render_params(metas[0], mosaics[0]))
    n = strip_count(height, 1288, len(devices), 2)
    strips = plan_strips(height, n)
    image = np.empty((height, width, 3), dtype=np.uint16)

    def job(y0: int, y1: int) -> Callable[[str], None]:
        def run(device: str) -> None:
            image[y0:y1] = render_strip(mosaics[0], y0, y1, params, device=device)
        return run

    # Warm-up (model resident, kernels compiled) as a started worker would be.
    _gpu_pool(devices, [job(*strips[0]) for _ in devices])
    t.run(f"enhance {len(strips)} strips on {len(devices)} device(s)",
          lambda: _gpu_pool(devices, [job(*s) for s in strips]), devices)
    t.run(f"TIFF encode ({tiff_threads} threads)", lambda: _encode(image, tmp, tiff_threads))
    t.run("TIFF encode (4 threads)", lambda: _encode(image, tmp, 4))
    total = sum(v for k, v in t.stages.items() if not k.startswith("TIFF encode (4"))
    return {"scenario": f"single frame {width}x{height}", "devices": devices, "stages": t.stages, "total_s": total}


def bench_stack(devices: list[str], frames: int, height: int, width: int, tmp: Path, tiff_threads: int) -> dict:
    """IQ2_XS-style stack: decode all → frame groups on the GPUs → strips (each fuses its rows) → TIFF."""
    t = Timer()
    paths = write_stack_frames(tmp, frames, height, width)
    _decode_all(paths, tmp)  # warm-up: a running coordinator has its decoder children started ahead (raw/decode.py)
    time.sleep(1.0)
    mosaics, metas = t.run(f"decode {frames} frames (LibRaw children in parallel)", lambda: _decode_all(paths, tmp))
    params = t.run("shot params (WB, noise, colour)",
                   lambda: replace(shot_render_params(metas[0], mosaics[0]), frames=frames))
    groups = plan_frame_groups(frames, len(devices))

    def group_job(indices: list[int]) -> Callable[[str], np.ndarray]:
        return lambda device: merge_frame_group((mosaics[0], metas[0]), [(mosaics[i], metas[i]) for i in indices],
                                                device=device, params=params, stack_size=frames, positions=indices)

    _gpu_pool(devices, [group_job([0]) for _ in devices])  # warm-up
    results = t.run(f"align+merge {len(groups)} group(s) on {len(devices)} device(s)",
                    lambda: _gpu_pool(devices, [group_job(g) for g in groups]), devices)
    strips = plan_strips(height, strip_count(height, 1288, len(devices), 2))
    image = np.empty((height, width, 3), dtype=np.uint16)

    def strip_job(y0: int, y1: int) -> Callable[[str], None]:
        def run(device: str) -> None:
            image[y0:y1] = render_stack_strip(results, y0, y1, params, device=device, pixel_shift=False)
        return run

    t.run(f"fuse + enhance {len(strips)} strips", lambda: _gpu_pool(devices, [strip_job(*s) for s in strips]),
          devices)
    t.run(f"TIFF encode ({tiff_threads} threads)", lambda: _encode(image, tmp, tiff_threads))
    total = sum(t.stages.values())
    return {"scenario": f"{frames}-frame stack {width}x{height}", "devices": devices, "stages": t.stages,
            "total_s": total}


def machine() -> dict:
    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def print_table(results: list[dict]) -> None:
    for r in results:
        print(f"\n{r['scenario']} on {', '.join(r['devices'])}")
        for name, secs in r["stages"].items():
            print(f"  {name:<55} {secs:8.3f} s")
        print(f"  {'total (end to end, without the 4-thread encode line)':<55} {r['total_s']:8.3f} s")


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="strata bench pipeline", description=__doc__)
    ap.add_argument("--devices", type=torch_devices, default="cuda:0" if torch.cuda.is_available() else "cpu",
                    help="comma list, e.g. cuda:0,cuda:1; each scenario runs on 1..N of them")
    ap.add_argument("--scale", type=positive_float, default=1.0, help="linear size relative to the real sensors")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--scenarios", default="single,stack")
    ap.add_argument("--tiff-threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--json", type=Path, default=Path("bench-pipeline.json"))
    args = ap.parse_args(argv)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    from services.pipeline.models.package import configure_cuda_numerics

    configure_cuda_numerics(True)  # as in the GPU workers (workers/runtime.py)
    results = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as d:
        tmp = Path(d)
        for n in range(1, len(devices) + 1):
            devs = devices[:n]
            if "single" in args.scenarios:
                h, w = int(10304 * args.scale) // 2 * 2, int(7728 * args.scale) // 2 * 2
                results.append(bench_single_frame(devs, h, w, tmp, args.tiff_threads))
            if "stack" in args.scenarios:
                h, w = int(7296 * args.scale) // 2 * 2, int(6912 * args.scale) // 2 * 2
                results.append(bench_stack(devs, args.frames, h, w, tmp, args.tiff_threads))
            print_table(results[-2:] if args.scenarios.count(",") else results[-1:])
    args.json.write_text(json.dumps({"machine": machine(), "results": results}, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
