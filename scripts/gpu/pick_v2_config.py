"""GPU host: time candidate ``strata_jdd_v2`` network configs on an 80 MP frame as a worker runs them (bf16,
random weights: the cost does not depend on them) and print the largest one within the budget, as training
arguments (``--width W --dilations D``). The issue's bound for the best package is 0.4 s of GPU per 80 MP frame;
the default budget keeps a margin below it.

    python3 scripts/gpu/pick_v2_config.py --budget 0.33 --json OUT/pick.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.pipeline.models import jdd  # noqa: E402
from services.pipeline.models.jdd import JDDEnhancer, JDDNet, jdd_manifest  # noqa: E402
from training.train import median_enhance_seconds  # noqa: E402

CANDIDATES = [  # largest first
    (64, [1, 1, 2, 3, 3, 2, 1, 1]),
    (64, [1, 2, 3, 3, 2, 1, 1]),
    (64, [1, 2, 3, 3, 2, 1]),
    (56, [1, 2, 3, 3, 2, 1]),
    (48, [1, 2, 3, 3, 2, 1]),
]


def seconds(width: int, dilations: list[int], mosaic: torch.Tensor) -> float:
    config = {"width": width, "dilations": dilations}
    model = JDDEnhancer(jdd_manifest("t", ("*",), config, {}), JDDNet(width, dilations), mosaic.device,
                        torch.bfloat16)
    return median_enhance_seconds(model, mosaic)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--budget", type=float, default=0.33)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    mosaic = torch.rand(1, 1, 7744, 10328, device="cuda")  # an IQ3_S-sized frame (80 MP)
    rows = []
    pick = None
    for width, dilations in CANDIDATES:
        s = seconds(width, dilations, mosaic)
        config = {"width": width, "dilations": dilations}
        rows.append({"width": width, "dilations": dilations, "seconds": s,
                     "flops_per_pixel": jdd.flops_per_pixel(config),
                     "receptive_field": jdd.jdd_receptive_field(config)})
        print(f"width {width} dilations {dilations}: {s:.3f} s, {jdd.flops_per_pixel(config):.0f} FLOPs/px",
              file=sys.stderr)
        if pick is None and s <= args.budget:
            pick = (width, dilations)
    pick = pick or CANDIDATES[-1]
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "budget": args.budget,
                                               "rows": rows, "pick": pick}, indent=2) + "\n")
    print(f"--width {pick[0]} --dilations {','.join(str(d) for d in pick[1])}")


if __name__ == "__main__":
    main()
