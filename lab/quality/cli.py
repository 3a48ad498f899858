"""``strata quality`` (``python -m lab.quality.cli``): the command line of the single-frame quality benchmark."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from lab.args import positive_float, torch_device
from lab.quality import benchmark
from lab.quality.anchors import LIBRAW_METHODS
from lab.quality.artefacts import artefact_lines
from lab.quality.benchmark import DEFAULT_SCALE, run_benchmark
from lab.quality.report import CROP_SIZE, CROP_ZOOM, json_safe, markdown_tables, print_report
from lab.quality.shots import CFA_CYCLE, LEVELS
from lab.synth.unprocess import content_problem, noise_level


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``strata quality``."""
    ap = argparse.ArgumentParser(prog="strata quality", description=(benchmark.__doc__ or "").split("\n\n")[0])
    ap.add_argument("--scale", type=positive_float, default=DEFAULT_SCALE, help="frame size as a fraction of IQ3_S")
    ap.add_argument("--levels", default=",".join(LEVELS), help="noise levels (names or shot coefficients)")
    ap.add_argument("--content", default=None,
                    help="comma list: photo:NNN, skimage:NAME, a path, dead_leaves:SEED, pattern:NAME (a test scene) "
                    "(default: held-out set)")
    ap.add_argument("--photos-dir", type=Path, default=None, help="photographs (default ../shared/data/photos)")
    ap.add_argument("--cfa", default=None, choices=CFA_CYCLE, help="one CFA phase (default: cycle all four)")
    ap.add_argument("--device", type=torch_device, default=None,
                    help="torch device for the Strata path (default cuda if present)")
    ap.add_argument("--methods", default=None,
                    help="comma list of packages (name or path; NAME@N renders it as a self-ensemble of N "
                         "orientations: the max tier is strata_jdd_v2.strata@4; NAME@auto as the best tier picks, two "
                         "orientations on a clean shot) and LibRaw methods "
                         f"({', '.join(LIBRAW_METHODS)}); default: all")
    ap.add_argument("--limit", type=int, default=None, help="at most N shots per level")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--markdown", type=Path, default=None, help="write the tables as Markdown here")
    ap.add_argument("--crops", type=Path, default=None, help="write PNG crop strips (one shot per level) here")
    ap.add_argument("--crop-size", type=int, default=CROP_SIZE, help="source pixels per crop tile")
    ap.add_argument("--crop-zoom", type=int, default=CROP_ZOOM, help="pixel-replication zoom of the crop tiles")
    ap.add_argument("--cache", type=Path, default=None, help="keep synthetic DNGs here (default: temporary)")
    ap.add_argument("--sharpen-amount", type=float, default=None,
                    help="diagnostic: override the pipeline's sharpen amount (default: as the workers render)")
    ap.add_argument("--artefacts", action="store_true",
                    help="the artefact benchmark: test scenes (pattern:NAME, lab/synth/scenes.py) and natural controls "
                    "(or --content), each at the four CFA phases; adds chroma error, glow into flat black and tint "
                    "on neutral texture per content (lab/quality/artefacts.py)")
    ap.add_argument("--quiet", action="store_true", help="no per-shot progress lines")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: parse ``argv``, run, print the tables, write JSON; returns 0 (1 when nothing was scored)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for level in _csv(args.levels):
        try:
            noise_level(level)
        except ValueError as exc:
            parser.error(str(exc))
    for spec in _csv(args.content) if args.content else []:
        problem = content_problem(spec, args.photos_dir)
        if problem:
            parser.error(f"--content {spec}: {problem}")
    report = run_benchmark(
        scale=args.scale, levels=_csv(args.levels), content=_csv(args.content) if args.content else None,
        photos_dir=args.photos_dir, cfa=args.cfa, device=args.device,
        methods=_csv(args.methods) if args.methods else None, limit=args.limit, crops_dir=args.crops,
        crop_size=args.crop_size, crop_zoom=args.crop_zoom, cache_dir=args.cache,
        sharpen_amount=args.sharpen_amount,
        progress=None if args.quiet else (lambda msg: print(msg, flush=True)), artefacts=args.artefacts,
    )
    print_report(report)
    if args.artefacts:
        print("\n".join(artefact_lines(report["artefacts"])))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe(report), indent=1))
        print(f"wrote {args.json}")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_tables(report))
        print(f"wrote {args.markdown}")
    return 0 if any(r["psnr"] is not None for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
