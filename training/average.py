"""A package whose weights are the average of two packages of one network: ``(1 - alpha) * A + alpha * B``.

Weight-space averaging of a fine-tuned network with the one it started from (Wortsman et al. 2022, "Robust
fine-tuning of zero-shot models", WiSE-FT) keeps much of what the fine-tune learned and much of what it forgot:
2.3.0 of ``strata_jdd_v2`` is 2.2.0 and session 41's fine-tune at alpha 0.5 (docs/training/README.md).

    python -m training.average A.strata B.strata --alpha 0.5 --version 2.3.0 --out strata_jdd_v2.strata

The manifest is B's (its name, architecture, cameras, config) with ``version`` and a ``training`` block that names
both inputs (name, version, weights' sha256), alpha and this command; B's own training block is kept under
``fine_tune``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from services.pipeline.models.manifest import Manifest
from services.pipeline.models.package import read_package, write_package


def _origin(path: Path, manifest: Manifest) -> dict[str, Any]:
    return {"file": path.name, "name": manifest.name, "version": manifest.version,
            "weights_sha256": manifest.sha256.get("weights")}


def average_packages(a_path: str | Path, b_path: str | Path, alpha: float, out: str | Path, version: str,
                     command: str = "") -> Manifest:
    """Write ``out``: A and B averaged at ``alpha`` (0 = A, 1 = B). Both must be the same network (architecture,
    config, tensor names and shapes); returns the manifest written."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    a, b = read_package(a_path), read_package(b_path)
    if a.weights is None or b.weights is None:
        raise ValueError("both packages must carry weights")
    if (a.manifest.architecture, a.manifest.config) != (b.manifest.architecture, b.manifest.config):
        raise ValueError(f"{a.path.name} and {b.path.name} are different networks: {a.manifest.architecture} "
                         f"{a.manifest.config} against {b.manifest.architecture} {b.manifest.config}")
    shapes_a = {k: tuple(v.shape) for k, v in a.weights.items()}
    shapes_b = {k: tuple(v.shape) for k, v in b.weights.items()}
    if shapes_a != shapes_b:
        raise ValueError(f"{a.path.name} and {b.path.name} hold different tensors")
    weights = {k: (1.0 - alpha) * a.weights[k].float() + alpha * b.weights[k].float() for k in a.weights}
    training = {"averaged": {"from": [_origin(a.path, a.manifest), _origin(b.path, b.manifest)], "alpha": alpha,
                             "command": command or "python -m training.average"},
                "fine_tune": dict(b.manifest.training or {})}
    manifest = Manifest.from_dict({**b.manifest.to_dict(), "version": version, "training": training})
    return write_package(out, manifest, weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.average", description=__doc__.split("\n")[0])
    parser.add_argument("a", type=Path, help="package A (alpha 0), e.g. the fine-tune's init")
    parser.add_argument("b", type=Path, help="package B (alpha 1), e.g. the fine-tuned package")
    parser.add_argument("--alpha", type=float, default=0.5, help="B's share (default 0.5)")
    parser.add_argument("--version", required=True, help="the written package's version")
    parser.add_argument("--out", type=Path, required=True, help="the package file to write (.strata)")
    args = parser.parse_args(argv)
    command = "python -m training.average " + " ".join(sys.argv[1:] if argv is None else argv)
    written = average_packages(args.a, args.b, args.alpha, args.out, args.version, command)
    print(f"wrote {args.out}: {written.name} {written.version}, weights sha256 {written.sha256.get('weights')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
