"""Blown highlights: over-exposed shots (the linear scene x3, a 3200 K white: 3-38 % of the frame clipped) rendered
with and without ``clip_highlights`` and by LibRaw AHD, scored against the ground truth (PSNR over the frame and
inside the clipped region, 2 px around the clipped sites). CPU, scale 0.043, held-out photographs.

    python scripts/experiments/highlights.py      (docs/QUALITY.md, "Blown highlights")
"""
import tempfile
from pathlib import Path

import numpy as np
import rawpy
import tifffile
from scipy.ndimage import binary_dilation

import services.pipeline.render as render
from lab.synth import synth
from lab.synth import unprocess as up
from lab.synth.synth import synthesize_shot
from services.pipeline.shot import shot_render_params
from services.raw.decode import decode_raw

orig = synth._content_frames
def bright(*a, **k):
    return [f * 3.0 for f in orig(*a, **k)]
synth._content_frames = bright

def psnr(a, b, mask=None):
    d = (a.astype(np.float64) - b.astype(np.float64)) / 65535
    d = d[8:-8, 8:-8]
    if mask is not None:
        d = d[mask[8:-8, 8:-8]]
    return 10 * np.log10(1 / max((d ** 2).mean(), 1e-12))

rows = []
for content in ["photo:033", "photo:034", "photo:036", "photo:038"]:
    for noise in ["none", "mid"]:
        d = Path(tempfile.mkdtemp())
        shot = synthesize_shot("IQ3_S", d, scale=0.043, noise=noise, content=content, white=up.planckian_white(3200.0),
                               photos_dir=Path(__file__).resolve().parents[3] / "shared" / "data" / "photos")
        gt = tifffile.imread(shot.ground_truth)
        meta = decode_raw(shot.files[0], d / "m.npy")
        m = np.load(d / "m.npy")
        p = shot_render_params(meta, m)
        after = render.render_mosaic(m, p)
        keep = render.clip_highlights
        render.clip_highlights = lambda rgb, gains: rgb
        before = render.render_mosaic(m, p)
        render.clip_highlights = keep
        with rawpy.imread(str(shot.files[0])) as r:
            raw_sat = (r.raw_image_visible >= r.white_level * 0.999)
            lib = r.postprocess(output_bps=16, use_camera_wb=True, no_auto_bright=True, gamma=(2.4, 12.92), user_flip=0)
        # the clipped region: 2x2 cells with a saturated site, grown by 2 px
        mask = raw_sat.copy()
        mask = binary_dilation(mask, iterations=2)
        rows.append((content, noise, mask.mean(), psnr(before, gt), psnr(after, gt), psnr(lib, gt),
                     psnr(before, gt, mask), psnr(after, gt, mask), psnr(lib, gt, mask)))
        print(f"{content} {noise}: clipped {mask.mean()*100:.1f} %  whole before/after/LibRaw "
              f"{rows[-1][3]:.2f} / {rows[-1][4]:.2f} / {rows[-1][5]:.2f}   clipped region "
              f"{rows[-1][6]:.2f} / {rows[-1][7]:.2f} / {rows[-1][8]:.2f}", flush=True)
