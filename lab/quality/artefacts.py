"""The artefact benchmark (``strata quality --artefacts``): the test scenes of :mod:`lab.synth.scenes` (false colour
at the sampling limit, glow into flat black next to fine texture, a tint on neutral fine texture) and a few natural
controls, each at the four CFA phases, rendered like every shot of ``strata quality`` (synthetic DNG ->
``decode_raw`` -> ``render_mosaic`` for a package; LibRaw), scored by PSNR and by the measure of its artefact:

* ``chroma_err`` (region ``pattern``): mean |chroma(image) - chroma(truth)| in 8-bit sRGB codes, chroma = RGB minus
  the pixel's mean of R, G, B (a neutral pattern rendered in colour scores its colour);
* ``flat_rgb`` / ``glow`` (region ``flat``, truth 0): the mean colour of the flat black 3-30 px from the texture,
  and its largest channel, in codes;
* ``mean_rgb`` / ``tint`` (region ``neutral``): the texture's mean colour in codes, and max - min of it minus the
  truth's (0: neutral);
* ``tex_err`` / ``grain_err`` (regions ``texture`` / ``grain``): the RMS error in codes of saturated fine texture
  (a false grid or blotches drawn into it, or the texture flattened, all count), all of it / its low-contrast
  1-px grain.

Everything excludes the metrics' 8-pixel border (:data:`lab.quality.metrics.BORDER`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lab.quality.metrics import BORDER, to_unit
from lab.synth.scenes import SCENES, scene, scene_name

CONTROLS = ("photo:033", "photo:037", "dead_leaves:900001")  # natural content: PSNR only
ARTEFACT_CONTENT = tuple(f"pattern:{s}" for s in SCENES) + CONTROLS
CFA_PHASES = ("RGGB", "BGGR", "GRBG", "GBRG")
# the headline measure of each region kind, codes, lower is better
MEASURES = ("chroma_err", "glow", "tint", "tex_err", "grain_err")
CODES = 255.0


def every_phase(specs: Sequence[str]) -> list[str]:
    """Each spec four times in a row: :func:`lab.quality.shots.parse_shots` cycles the CFA phase over shots, so each
    content is then rendered at RGGB, BGGR, GRBG and GBRG."""
    return [s for s in specs for _ in CFA_PHASES]


def _inner(mask: np.ndarray) -> np.ndarray:
    out = np.zeros_like(mask)
    out[BORDER:-BORDER, BORDER:-BORDER] = mask[BORDER:-BORDER, BORDER:-BORDER]
    return out


def _chroma(rgb: np.ndarray) -> np.ndarray:
    return rgb - rgb.mean(axis=-1, keepdims=True)


def measure(content: str, image: np.ndarray, truth: np.ndarray) -> dict:
    """The artefact measures of a rendered test scene (``pattern:NAME``) against its truth; {} for other content or
    an image of another shape than the truth (a LibRaw render registered on an overlap)."""
    name = scene_name(content)
    if name is None or image.shape != truth.shape:
        return {}
    regions = scene(name, truth.shape[0], truth.shape[1])[1]
    img, ref = to_unit(image), to_unit(truth)
    out: dict = {}
    if "pattern" in regions:
        m = _inner(regions["pattern"])
        out["chroma_err"] = float(np.abs(_chroma(img[m]) - _chroma(ref[m])).mean() * CODES)
    if "flat" in regions:
        m = _inner(regions["flat"])
        rgb = img[m].mean(axis=0) * CODES
        out["flat_rgb"] = [round(float(v), 2) for v in rgb]
        out["glow"] = float(rgb.max() - ref[m].mean(axis=0).max() * CODES)
    if "neutral" in regions:
        m = _inner(regions["neutral"])
        rgb, want = img[m].mean(axis=0) * CODES, ref[m].mean(axis=0) * CODES
        out["mean_rgb"] = [round(float(v), 2) for v in rgb]
        out["truth_rgb"] = [round(float(v), 2) for v in want]
        out["tint"] = float(np.ptp(rgb) - np.ptp(want))
    for region, key in (("texture", "tex_err"), ("grain", "grain_err")):
        if region in regions:
            m = _inner(regions[region])
            out[key] = float(np.sqrt(np.mean((img[m] - ref[m]) ** 2)) * CODES)
    return out


def _mean(rows: list[dict], key: str) -> float | list[float] | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return None
    mean = np.mean(np.asarray(values, dtype=np.float64), axis=0)
    return [round(float(v), 2) for v in mean] if np.ndim(mean) else float(mean)


def summarise_artefacts(rows: list[dict]) -> list[dict]:
    """Per content x level x method, the means over the CFA phases of PSNR and every artefact measure."""
    keys = sorted({(r["content"], r["level"], r["method"]) for r in rows if r.get("psnr") is not None},
                  key=lambda k: (ARTEFACT_CONTENT.index(k[0]) if k[0] in ARTEFACT_CONTENT else 99, k[0], k[1], k[2]))
    out = []
    for content, level, method in keys:
        sel = [r for r in rows if (r["content"], r["level"], r["method"]) == (content, level, method)
               and r.get("psnr") is not None]
        entry: dict = {"content": content, "level": level, "method": method, "phases": sorted({r["cfa"] for r in sel}),
                       "psnr": _mean(sel, "psnr")}
        for key in (*MEASURES, "flat_rgb", "mean_rgb", "truth_rgb"):
            value = _mean(sel, key)
            if value is not None:
                entry[key] = value
        out.append(entry)
    return out


def _cell(v: float | list[float] | None, spec: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "(" + ",".join(f"{x:.0f}" for x in v) + ")"
    return format(v, spec)


def artefact_lines(summary: list[dict]) -> list[str]:
    """The artefact table as plain-text lines (one per content x level x method)."""
    lines = [f"{'content':<22} {'level':<5} {'method':<28} {'PSNR':>6} {'chroma':>7} {'glow':>6} {'tint':>6} "
             f"{'tex':>6} {'grain':>6}  colour"]
    for e in summary:
        colour = e.get("flat_rgb") or e.get("mean_rgb")
        lines.append(f"{e['content']:<22} {e['level']:<5} {e['method'][:28]:<28} {_cell(e['psnr'], '6.2f'):>6} "
                     f"{_cell(e.get('chroma_err'), '7.2f'):>7} {_cell(e.get('glow'), '6.2f'):>6} "
                     f"{_cell(e.get('tint'), '6.2f'):>6} {_cell(e.get('tex_err'), '6.2f'):>6} "
                     f"{_cell(e.get('grain_err'), '6.2f'):>6}  {_cell(colour, '')}")
    return lines


__all__ = ["ARTEFACT_CONTENT", "CONTROLS", "MEASURES", "artefact_lines", "every_phase", "measure",
           "summarise_artefacts"]
