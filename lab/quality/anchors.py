"""The LibRaw anchors: reference renders of the same DNGs by LibRaw (rawpy), each in a child process.

LibRaw runs with colorimetric settings matching the DNG rendering (camera WB, no auto-bright, sRGB primaries
and transfer curve, 16 bits, file white level kept): AHD, AAHD, DCB, and AHD with FBDD noise reduction + 3
median passes (:data:`LIBRAW_METHODS`). A LibRaw crash or hang in the child is reported, not fatal. LibRaw's
wavelet denoise (``noise_thr``) is never used: it double-frees on small DNGs.

The child process imports this module: it needs only numpy + rawpy (keep heavy imports out of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

LIBRAW_TIMEOUT_S = 300.0

# name -> (demosaic algorithm, FBDD noise reduction, median filter passes)
LIBRAW_METHODS: dict[str, tuple[str, str, int]] = {
    "libraw_ahd": ("AHD", "Off", 0),
    "libraw_aahd": ("AAHD", "Off", 0),
    "libraw_dcb": ("DCB", "Off", 0),
    "libraw_ahd_fbdd_med3": ("AHD", "Full", 3),
}
LIBRAW_AHD = "libraw_ahd"


def libraw_render(path: str, method: str) -> tuple[np.ndarray, float]:
    """Render a DNG with LibRaw (rawpy) the colorimetric way: (H, W, 3) uint16 sRGB and the seconds it took.

    Camera WB, no auto-bright, sRGB primaries, sRGB curve (``gamma=(2.4, 12.92)``), 16 bits, no flip and
    ``adjust_maximum_thr=0`` (keep the file's white level; LibRaw otherwise rescales by the data maximum).
    Never sets ``noise_thr``. Meant to run in a child process (see :class:`LibRawRunner`).
    """
    import rawpy

    demosaic, fbdd, median_passes = LIBRAW_METHODS[method]
    t0 = time.perf_counter()
    with rawpy.imread(path) as raw:
        out = raw.postprocess(
            use_camera_wb=True,
            no_auto_bright=True,
            output_color=rawpy.ColorSpace.sRGB,
            output_bps=16,
            gamma=(2.4, 12.92),
            user_flip=0,
            adjust_maximum_thr=0.0,
            demosaic_algorithm=getattr(rawpy.DemosaicAlgorithm, demosaic),
            fbdd_noise_reduction=getattr(rawpy.FBDDNoiseReductionMode, fbdd),
            median_filter_passes=median_passes,
        )
    return np.ascontiguousarray(out), time.perf_counter() - t0


class LibRawRunner:
    """Runs functions in one spawned child process; a crash or hang becomes an error message, not our death."""

    def __init__(self, timeout_s: float = LIBRAW_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _discard(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):  # a hung child: kill it, by its own handle
            if proc.is_alive():
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``(fn(*args), None)``, or ``(None, reason)`` when it raised, crashed or timed out."""
        try:
            return self._executor().submit(fn, *args).result(timeout=self.timeout_s), None
        except BrokenProcessPool:
            self._discard()
            return None, "child process crashed (LibRaw abort or signal)"
        except FutureTimeout:
            self._discard()
            return None, f"timed out after {self.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - any error in the child is a result to report
            return None, f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Stop the child process."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> LibRawRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
