"""Where the service's storage round trips cost time on a GPU host (not the GPU work): frames from .npy memory
maps to the GPU, an 800 MB accumulator into a fresh memory-mapped .npy, strip rows back, the TIFF.

python scripts/gpu/io_probe.py --device cuda:0 [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from services.export.tiff import write_tiff
from services.pipeline.render import mosaic_tensor
from services.pipeline.transfer import download, upload
from services.storage.local import LocalStorage


def t(label: str, fn, n: int = 3) -> None:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(f"{label:58s} " + " ".join(f"{x:.3f}" for x in times), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    dev = torch.device(args.device)
    h, w = 6912, 7296
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        st = LocalStorage(Path(d))
        rng = np.random.default_rng(0)
        frame = rng.integers(1024, 60000, (h, w), dtype=np.uint16)
        for i in range(5):
            st.save_array(f"raw/{i}.npy", frame, durable=False)
        t("save 100 MB frame .npy (decode child's write)", lambda: st.save_array("raw/x.npy", frame, durable=False))
        t("5 frames: mmap + upload (page cache)", lambda: [mosaic_tensor(st.load_array(f"raw/{i}.npy"), dev)
                                                          for i in range(5)])
        t("5 frames: np.load into RAM then upload", lambda: [mosaic_tensor(np.load(st.local_path(f"raw/{i}.npy")),
                                                                           dev) for i in range(5)])
        acc = torch.randint(0, 1 << 30, (4, h, w), dtype=torch.int32, device=dev)
        t("download 800 MB acc into np.empty", lambda: download(acc))
        buf = np.empty((4, h, w), np.int32)
        t("download 800 MB acc into a reused array", lambda: download(acc, buf))

        counter = iter(range(1000))

        def to_file() -> None:
            with st.array_writer(f"p0/g{next(counter)}.npy", (4, h, w), np.int32, durable=False) as out:
                download(acc, out)
        t("download 800 MB acc into array_writer (fresh mmap file)", to_file)

        def to_pwrite() -> None:
            host = download(acc, buf)
            with st.writer(f"p0/w{next(counter)}.npy", durable=False) as f:
                np.lib.format.write_array_header_1_0(f, {"descr": "<i4", "fortran_order": False, "shape": (4, h, w)})
                f.write(memoryview(host).cast("B"))
        t("download into RAM + one file write", to_pwrite)
        g = [st.load_array("p0/g0.npy"), st.load_array("p0/g1.npy")]
        t("strip rows 1340 x 2 groups: upload from mmaps", lambda: [upload(x[:, 0:1340], dev) for x in g])
        rgb = rng.integers(0, 65535, (h, w, 3), dtype=np.uint16)
        rgb[:, :, 1] = rgb[:, :, 0] // 2  # something compressible
        bands = [(y, rgb[y:y + 1152]) for y in range(0, h, 1152)]
        t("write_tiff zstd-3 (292 MB image)", lambda: write_tiff(st, "out/a.tif", bands, compression="zstd"))
        t("write_tiff uncompressed", lambda: write_tiff(st, "out/b.tif", bands, compression=None))
        print("tiff sizes", st.size("out/a.tif"), st.size("out/b.tif"))
        os.sync()


if __name__ == "__main__":
    main()
