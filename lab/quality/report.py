"""The quality benchmark's report: summary means and margins, the console and Markdown tables, machine info,
JSON-safe values and the PNG crop strips."""

from __future__ import annotations

import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lab.quality.anchors import LIBRAW_AHD, LIBRAW_METHODS
from lab.quality.metrics import BORDER, to_unit

CROP_SIZE = 128  # source pixels of a crop tile; shown at CROP_ZOOM (nearest) -> 256 x 256 tiles
CROP_ZOOM = 2


def _nanmean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else None


def summarise(rows: list[dict], levels: Sequence[str], methods: Sequence[str]) -> dict:
    """Means per level x method, the best LibRaw method per level and each package's margins (dB)."""
    means: dict[str, dict[str, dict]] = {}
    best: dict[str, str | None] = {}
    margins: dict[str, dict[str, dict]] = {}
    for level in levels:
        means[level] = {}
        for m in methods:
            sel = [r for r in rows if r["level"] == level and r["method"] == m and r.get("psnr") is not None]
            if sel:
                means[level][m] = {
                    "psnr": _nanmean([min(r["psnr"], 200.0) for r in sel]),
                    "ssim": _nanmean([r["ssim"] for r in sel]),
                    "seconds": _nanmean([r["seconds"] for r in sel]),
                    "shots": len(sel),
                }
        libraw = {m: v for m, v in means[level].items() if m in LIBRAW_METHODS}
        best[level] = max(libraw, key=lambda m: libraw[m]["psnr"]) if libraw else None
        margins[level] = {}
        for m, v in means[level].items():
            if m in LIBRAW_METHODS:
                continue
            entry: dict[str, float | None] = {"vs_libraw_ahd": None, "vs_best_libraw": None}
            if LIBRAW_AHD in libraw:
                entry["vs_libraw_ahd"] = v["psnr"] - libraw[LIBRAW_AHD]["psnr"]
            if best[level] is not None:
                entry["vs_best_libraw"] = v["psnr"] - libraw[best[level]]["psnr"]  # type: ignore[index]
            margins[level][m] = entry
    return {"mean": means, "best_libraw": best, "margins": margins}


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_report(report: dict) -> None:
    """Print the per level x method table and the margins (rich when available)."""
    summary, levels, methods = report["summary"], report["settings"]["levels"], report["methods"]
    header = ["level", "method", "PSNR dB", "SSIM", "s/shot", "shots"]
    rows: list[list[str]] = []
    for level in levels:
        for m in methods:
            v = summary["mean"].get(level, {}).get(m)
            if v is None:
                continue
            star = " *" if summary["best_libraw"].get(level) == m else ""
            rows.append([level, m + star, _fmt(v["psnr"], ".2f"), _fmt(v["ssim"], ".4f"), _fmt(v["seconds"], ".3f"),
                         str(v["shots"])])
    margin_rows = [[level, m, _fmt(e["vs_libraw_ahd"], "+.2f"), _fmt(e["vs_best_libraw"], "+.2f"),
                    str(summary["best_libraw"].get(level))]
                   for level in levels for m, e in summary["margins"].get(level, {}).items()]
    margin_header = ["level", "package", "vs LibRaw AHD dB", "vs best LibRaw dB", "best LibRaw"]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        for head, body in ((header, rows), (margin_header, margin_rows)):
            print(" | ".join(head))
            for r in body:
                print(" | ".join(r))
            print()
    else:
        console = Console()
        for title, head, body in (("Quality vs ground truth (* = best LibRaw)", header, rows),
                                  ("Margins of Strata packages", margin_header, margin_rows)):
            table = Table(title=title)
            for h in head:
                table.add_column(h, justify="left" if h in ("level", "method", "package", "best LibRaw") else "right")
            for r in body:
                table.add_row(*r)
            console.print(table)
    for note in report["notes"]:
        print(f"note: {note}")


def markdown_tables(report: dict) -> str:
    """The mean table (level x method) and the margins as Markdown, for docs/QUALITY.md."""
    summary, levels, methods = report["summary"], report["settings"]["levels"], report["methods"]
    lines = ["| level | method | PSNR dB | SSIM | s/shot | shots |", "|---|---|---:|---:|---:|---:|"]
    for level in levels:
        for m in methods:
            v = summary["mean"].get(level, {}).get(m)
            if v is not None:
                name = f"**{m}** (best LibRaw)" if summary["best_libraw"].get(level) == m else m
                lines.append(f"| {level} | {name} | {_fmt(v['psnr'], '.2f')} | {_fmt(v['ssim'], '.4f')} | "
                             f"{_fmt(v['seconds'], '.3f')} | {v['shots']} |")
    lines += ["", "| level | package | vs LibRaw AHD (dB) | vs best LibRaw (dB) | best LibRaw |",
              "|---|---|---:|---:|---|"]
    for level in levels:
        for m, e in summary["margins"].get(level, {}).items():
            lines.append(f"| {level} | {m} | {_fmt(e['vs_libraw_ahd'], '+.2f')} | "
                         f"{_fmt(e['vs_best_libraw'], '+.2f')} | {summary['best_libraw'].get(level)} |")
    return "\n".join(lines) + "\n"


def machine_info(device: str) -> dict:
    """Host, library versions and the accelerator used."""
    import rawpy
    import torch

    info: dict[str, Any] = {
        "host": platform.node(), "platform": platform.platform(), "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "rawpy": rawpy.__version__,
        "libraw": ".".join(str(v) for v in rawpy.libraw_version), "numpy": np.__version__, "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def detail_window(truth: np.ndarray, size: int) -> tuple[int, int]:
    """Top-left of the ``size`` x ``size`` window (stride size/4, inside BORDER) with the most gradient energy."""
    g = to_unit(truth).mean(axis=2)
    energy = np.abs(np.diff(g, axis=0))[:, :-1] + np.abs(np.diff(g, axis=1))[:-1]
    h, w = energy.shape
    size = min(size, h - 2 * BORDER, w - 2 * BORDER)
    step = max(size // 4, 1)
    best, pos = -1.0, (BORDER, BORDER)
    for y in range(BORDER, h - size - BORDER + 1, step):
        for x in range(BORDER, w - size - BORDER + 1, step):
            e = float(energy[y : y + size, x : x + size].sum())
            if e > best:
                best, pos = e, (y, x)
    return pos


def write_strip(path: Path, tiles: list[tuple[str, np.ndarray]], zoom: int = CROP_ZOOM, gap: int = 4) -> Path:
    """Save labelled 8-bit tiles (uint16 or uint8 (h, w, 3)) side by side as a PNG, each enlarged ``zoom`` times
    by pixel replication (demosaic artefacts stay visible, PNG stays small)."""
    from PIL import Image, ImageDraw

    head = 16
    h, w = (zoom * n for n in tiles[0][1].shape[:2])
    canvas = Image.new("RGB", (len(tiles) * w + (len(tiles) - 1) * gap, h + head), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for i, (label, tile) in enumerate(tiles):
        arr = tile if tile.dtype == np.uint8 else np.rint(to_unit(tile) * 255).clip(0, 255).astype(np.uint8)
        arr = np.repeat(np.repeat(arr, zoom, axis=0), zoom, axis=1)
        canvas.paste(Image.fromarray(arr), (i * (w + gap), head))
        draw.text((i * (w + gap) + 2, 2), label, fill=(0, 0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path, optimize=True)
    return path


def json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj
