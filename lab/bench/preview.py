"""Preview speed: the fast path the coordinator runs at ingest, right after the reference frame is decoded.

Synthesises an IQ3_S frame (``--scale 1.0``: the full 80 MP sensor) with lab.synth, decodes it once through the
real sandboxed decoder (timed and reported: ingest decodes anyway), then times ``--repeats`` runs of what
:func:`services.jobs.previews.fast_preview` does: load the decoded mosaic, white balance + colour decision,
2x2-and-more binning + colour + sRGB (:func:`~services.pipeline.preview.mosaic_preview`), JPEG encode and write.
Then, where the frame is an uncompressed DNG, the way ingest makes it now: the decode's band copy without and with
the preview's binning on the way (``decode_copy``, ``decode_copy_bin``), then colour and JPEG from the bin sums
(``bins_after_decode``: what remains after the decode). Prints a table (median, p95 per step) and writes JSON
(``--out``). The issue's target: preview ready <= 300 ms
after the upload completes on one H200 host; on the CPU this reports what it is.

    python -m lab.bench.preview --scale 1.0 --repeats 10 --out docs/perf/preview-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from lab.args import positive_float
from lab.synth.synth import synthesize_shot
from services.export.preview import encode_jpeg
from services.pipeline.preview import MosaicBinner, binned_preview, mosaic_preview
from services.raw.colour import render_colour, white_balance_neutral
from services.raw.decode import decode_raw


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": round(statistics.median(ordered) * 1000, 1), "p95_ms": round(p95 * 1000, 1)}


def _one(raw: Path, meta: Any, out: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    mosaic = np.load(raw, mmap_mode="r")
    colour = render_colour(meta, "srgb", neutral=white_balance_neutral(meta, mosaic))
    t1 = time.perf_counter()
    rgb = mosaic_preview(mosaic, cfa=meta.cfa, black=meta.black_levels, white=meta.white_level, gains=colour.gains,
                         srgb_from_wb_cam=colour.out_from_wb_cam)
    t2 = time.perf_counter()
    out.write_bytes(encode_jpeg(rgb))
    t3 = time.perf_counter()
    return {"load_colour": t1 - t0, "bin_colour": t2 - t1, "jpeg_write": t3 - t2, "total": t3 - t0}


IQ3S_H, IQ3S_W = 10304, 7728  # the full sensor (80 MP)


def _mosaic_only(scale: float, work: Path) -> Any:
    """Without LibRaw (rawpy not installed): a random mosaic of the sensor's size and a plain profile; the
    preview's cost does not depend on the pixel values."""
    from services.raw.colour import CameraProfile
    from services.raw.meta import RawMeta

    h, w = int(IQ3S_H * scale) // 2 * 2, int(IQ3S_W * scale) // 2 * 2
    np.save(work / "raw.npy", np.random.default_rng(0).integers(512, 16000, (h, w), dtype=np.uint16))
    return RawMeta(width=w, height=h, cfa="RGGB", black_levels=(512.0,) * 4, white_level=16383.0,
                   profile=CameraProfile(np.eye(3)), as_shot_neutral=(0.5, 1.0, 0.7), make="Phase One",
                   model="IQ3 100MP", noise_profile=None)


def _decode(scale: float, work: Path, mosaic_only: bool) -> tuple[Any, float | None]:
    try:
        import rawpy  # noqa: F401
    except ImportError:
        mosaic_only = True
    if mosaic_only:
        return _mosaic_only(scale, work), None
    shot = synthesize_shot("IQ3_S", work / "shot", scale=scale, seed=3, noise=0.002)
    t0 = time.perf_counter()
    meta = decode_raw(Path(shot.files[0]), work / "raw.npy")
    return meta, time.perf_counter() - t0


def _in_decode(dng: Path, work: Path, threads: int) -> dict[str, float]:
    """What ingest does since the preview's binning moved into the decode: the fast DNG copy on ``threads``
    threads without and with the binner (the difference is what the preview adds to the decode), then colour and
    JPEG from the bin sums."""
    t0 = time.perf_counter()
    decode_raw(dng, work / "plain.npy", threads=threads)
    t1 = time.perf_counter()
    binner = MosaicBinner()
    meta = decode_raw(dng, work / "binned.npy", threads=threads, binner=binner)
    t2 = time.perf_counter()
    assert binner.ready and binner.sums is not None, "the fast DNG path did not take this file"
    colour = render_colour(meta, "srgb", neutral=white_balance_neutral(meta, np.load(work / "binned.npy",
                                                                                     mmap_mode="r")))
    t3 = time.perf_counter()
    rgb = binned_preview(binner, cfa=meta.cfa, black=meta.black_levels, white=meta.white_level,
                       gains=colour.gains, srgb_from_wb_cam=colour.out_from_wb_cam)
    t4 = time.perf_counter()
    (work / "preview-bins.jpg").write_bytes(encode_jpeg(rgb))
    t5 = time.perf_counter()
    for name in ("plain.npy", "binned.npy"):  # a job's raw file is a new one: no overwrite of a cached file
        (work / name).unlink()
    return {"decode_copy": t1 - t0, "decode_copy_bin": t2 - t1, "bins_colour": t4 - t3, "bins_jpeg_write": t5 - t4,
            "bins_after_decode": (t4 - t3) + (t5 - t4)}


def run(scale: float, repeats: int, work: Path, mosaic_only: bool = False, threads: int = 0) -> dict[str, Any]:
    meta, decode_s = _decode(scale, work, mosaic_only)
    _one(work / "raw.npy", meta, work / "warm.jpg")  # page cache, imports
    runs = [_one(work / "raw.npy", meta, work / "preview.jpg") for _ in range(repeats)]
    dng = next(iter(sorted((work / "shot").glob("*.dng"))), None) if (work / "shot").exists() else None
    if dng is not None:  # the binning inside the decode (ingest's way since it exists)
        copy_threads = threads or min(8, os.cpu_count() or 1)
        _in_decode(dng, work, copy_threads)
        for r, extra in zip(runs, [_in_decode(dng, work, copy_threads) for _ in range(repeats)], strict=True):
            r.update(extra)
    steps = {k: _stats([r[k] for r in runs]) for k in runs[0]}
    return {"frame": f"{meta.width}x{meta.height}", "megapixels": round(meta.width * meta.height / 1e6, 1),
            "repeats": repeats, "decode_ms": None if decode_s is None else round(decode_s * 1000, 1), "steps": steps,
            "preview_bytes": (work / "preview.jpg").stat().st_size, "machine": platform.platform(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="strata bench preview", description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=positive_float, default=1.0, help="IQ3_S sensor scale (1.0 = 80 MP)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--mosaic-only", action="store_true",
                        help="skip synthesising and decoding a DNG: time the preview on a random mosaic")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="strata-preview-bench-") as tmp:
        result = run(args.scale, args.repeats, Path(tmp), args.mosaic_only)
    decode = "not measured (no rawpy: random mosaic)" if result["decode_ms"] is None else f"{result['decode_ms']} ms"
    print(f"frame {result['frame']} ({result['megapixels']} MP); decode (ingest's, not the preview's) {decode}")
    print(f"{'step':<12} {'median ms':>10} {'p95 ms':>10}")
    for step, s in result["steps"].items():
        print(f"{step:<12} {s['median_ms']:>10} {s['p95_ms']:>10}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
