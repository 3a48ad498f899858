"""Argument types shared by the benchmark command lines: a device or a scale that cannot work is a usage error
(exit 2, one line naming the option) before a run starts, not a traceback from deep inside it."""

from __future__ import annotations

import argparse

import torch


def torch_device(text: str) -> str:
    """A torch device this machine has: ``cpu``, ``cuda``, ``cuda:N`` (N below the GPU count)."""
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device ({exc})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: no CUDA device on this machine (torch {torch.__version__}); "
                                             "use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} GPU(s)")
    elif device.type != "cpu":
        raise argparse.ArgumentTypeError(f"{text}: only cpu and cuda devices are supported")
    return text


def torch_devices(text: str) -> str:
    """A comma list of :func:`torch_device`\\ s (returned as given)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("no device given")
    for part in parts:
        torch_device(part)
    return text


def positive_float(text: str) -> float:
    """A finite number above 0 (a scale)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value
