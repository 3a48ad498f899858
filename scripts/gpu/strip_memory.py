"""Peak device memory per output pixel of a single-frame strip and of a stack strip (for the planner's
STRIP_BYTES_PER_PIXEL, services/jobs/planner.py). Usage on the GPU host: python scripts/gpu/strip_memory.py"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lab.bench.pipeline import CM, NEUTRAL, procedural_mosaic
from services.pipeline.models.package import configure_cuda_numerics
from services.pipeline.render import render_strip
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import merge_frame_group, render_stack_strip
from services.raw.colour import CameraProfile
from services.raw.meta import RawMeta


def _meta(h: int, w: int, model: str) -> RawMeta:
    return RawMeta(width=w, height=h, cfa="RGGB", black_levels=(1024.0,) * 4, white_level=65535.0,
                   profile=CameraProfile(CM), as_shot_neutral=tuple(NEUTRAL), make="Phase One", model=model,
                   noise_profile=None)


def _peak(fn) -> int:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main() -> None:
    configure_cuda_numerics(True)
    dev = "cuda:0"
    out = {}
    h, w = 10304, 7728
    mosaic = procedural_mosaic(h, w, 1)
    meta = _meta(h, w, "IQ3_S")
    params = shot_render_params(meta, mosaic, camera="IQ3_S")
    render_strip(mosaic, 0, 1288, params, dev)  # warm-up (model resident)
    for rows in (1288, 2576, 5152, 10304):
        peak = _peak(lambda: render_strip(mosaic, 0, rows, params, dev))  # noqa: B023
        out[f"frame {rows} rows"] = {"peak_bytes": peak, "bytes_per_pixel": peak / (rows * w)}
    sh, sw = 7296, 6912
    frames = [procedural_mosaic(sh, sw, 7, (0.0, 0.0) if k == 0 else (0.4 * k, -0.3 * k)) for k in range(4)]
    smeta = _meta(sh, sw, "IQ2_XS")
    sparams = shot_render_params(smeta, frames[0], camera="IQ2_XS")
    group = merge_frame_group((frames[0], smeta), [(f, smeta) for f in frames], dev, stack_size=4,
                              positions=[0, 1, 2, 3], params=sparams)
    render_stack_strip([group], 0, 1216, sparams, dev, pixel_shift=False)
    for rows in (1216, 2432, 7296):
        peak = _peak(lambda: render_stack_strip([group], 0, rows, sparams, dev, pixel_shift=False))  # noqa: B023
        out[f"stack {rows} rows"] = {"peak_bytes": peak, "bytes_per_pixel": peak / (rows * sw)}
    print(json.dumps(out, indent=1))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
