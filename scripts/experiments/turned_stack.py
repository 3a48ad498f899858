"""Stacks whose frames also turn (a hand-held camera's roll): the stack benchmark on dead leaves turned exactly.

``strata bench stack`` moves its frames by translations only. Here every frame but the reference is also turned
about the frame's centre by an angle drawn uniformly in [-MAX, MAX] degrees (its own random stream, so the shifts,
the scene and the noise stay those of the plain benchmark). Dead leaves are rendered exactly at any pose (discs
turned about the centre, the scene's gradient with them, then the same blur), so nothing but the turn differs
from the plain run; a photograph would need resampling, whose blur the frames' renders would carry (session 52
found it costing more than the turn). Everything after the synthesis is the benchmark's, as the service runs it.

    python scripts/experiments/turned_stack.py --max-degrees 1 -- --scale 0.1 --device cpu --seed 3 \\
        --noise 0.002 --case "4 frames" --case "8 frames"

(the arguments after ``--`` are `strata bench stack`'s; ``--content`` stays dead leaves). Numbers: docs/QUALITY.md,
"Tried and not kept".
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

import lab.synth.stack_synth as stack_synth
import lab.synth.synth as synth
from lab.quality import stack_bench

ANGLE_SEED = 11


def _leaves(scene: synth._Scene, canvas: tuple[int, int], place: np.ndarray, turn: float) -> np.ndarray:
    """The scene's discs over its background on a canvas (ch, cw), each disc centre moved by ``place`` (2,) after
    turning about the frame centre by ``turn`` radians: [ch, cw, 3] float32."""
    ch, cw = canvas
    pcy, pcx = scene.height / 2 - 0.5, scene.width / 2 - 0.5
    c, s = math.cos(turn), math.sin(turn)
    g = scene.gradient.astype(np.float32)
    leaves = np.broadcast_to(g[:, 0] + 0.5 * g[:, 1] + 0.5 * g[:, 2], (ch, cw, 3)).astype(np.float32).copy()
    for (cy, cx), r, colour in zip(scene.centres, scene.radii, scene.colours.astype(np.float32), strict=True):
        vy, vx = cy - pcy, cx - pcx
        synth.paint_disc(leaves, c * vy - s * vx + pcy + place[0], s * vy + c * vx + pcx + place[1], r, colour)
    return leaves


def render_turned(scene: synth._Scene, dy: float, dx: float, turn: float) -> np.ndarray:
    """``synth._render`` of the scene turned by ``turn`` radians about the frame centre, then moved by (dy, dx):
    frame pixel p shows scene point q where ``p = R (q - centre) + centre + (dy, dx)``. [H, W, 3] float32."""
    m = synth._BLUR_RADIUS
    ch, cw = scene.height + 2 * m, scene.width + 2 * m
    pcy, pcx = scene.height / 2 - 0.5, scene.width / 2 - 0.5
    c, s = math.cos(turn), math.sin(turn)
    py = (np.arange(ch, dtype=np.float64) - m)[:, None] - pcy - dy  # [ch, 1]
    px = (np.arange(cw, dtype=np.float64) - m)[None, :] - pcx - dx  # [1, cw]
    qy, qx = c * py + s * px + pcy, -s * py + c * px + pcx  # R^-1 (p - centre - d) + centre, [ch, cw]
    g = scene.gradient.astype(np.float32)
    ys, xs = (qy / scene.height).astype(np.float32), (qx / scene.width).astype(np.float32)
    gradient = g[:, 0] + g[:, 1] * ys[..., None] + g[:, 2] * xs[..., None]  # [ch, cw, 3]
    leaves = _leaves(scene, (ch, cw), np.array([dy + m, dx + m]), turn)
    image = np.float32(0.75) * leaves + np.float32(0.15) * np.clip(gradient, 0.0, 1.0)
    return np.clip(synth._blur_valid(image, synth.BLUR_SIGMA, m), 0.0, 0.9)


def turned_content(max_degrees: float):
    """A stand-in for ``stack_synth._content_frames``: dead leaves, frame k > 0 turned at random."""

    def frames(content: str, height: int, width: int, shifts: list[tuple[float, float]], rng: np.random.Generator,
               photos_dir: Path | str | None) -> list[np.ndarray]:
        if content != "dead_leaves":
            raise SystemExit("turned stacks are dead leaves only (a photograph's resampling would blur them)")
        scene = synth._make_scene(rng, height, width)
        angles = np.random.default_rng(ANGLE_SEED)
        out = []
        for k, (dy, dx) in enumerate(shifts):
            turn = 0.0 if k == 0 else math.radians(angles.uniform(-max_degrees, max_degrees))
            out.append(synth._render(scene, dy, dx) if turn == 0.0 else render_turned(scene, dy, dx, turn))
        return out

    return frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-degrees", type=float, default=1.0, help="largest turn of a frame (degrees)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `strata bench stack`'s arguments")
    args = parser.parse_args(argv)
    stack_synth._content_frames = turned_content(args.max_degrees)  # type: ignore[assignment]
    bench = [a for a in args.bench if a != "--"]
    return stack_bench.main(bench)


if __name__ == "__main__":
    sys.exit(main())
