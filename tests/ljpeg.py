"""A minimal lossless-JPEG (ITU T.81 process 14, SOF3) encoder for test files: 1-4 interleaved components,
predictor 1, one fixed 5-bit Huffman code per difference category. imagecodecs' encoder writes one component only;
DNG converters write linear (3-sample) raw data with three."""

from __future__ import annotations

import struct

import numpy as np


def ljpeg_encode(image: np.ndarray, bits: int = 16) -> bytes:
    """(H, W) or (H, W, C) unsigned samples of ``bits`` bits -> a lossless JPEG stream."""
    img = np.asarray(image, dtype=np.int64)
    img = img[..., None] if img.ndim == 2 else img
    h, w, nc = img.shape
    counts = [0] * 16
    counts[4] = 17  # categories 0..16, every code 5 bits long (none all ones)
    dht = bytes([0x00, *counts, *range(17)])
    sof = bytes([bits]) + struct.pack(">HH", h, w) + bytes([nc]) + b"".join(bytes([i + 1, 0x11, 0]) for i in range(nc))
    sos = bytes([nc]) + b"".join(bytes([i + 1, 0x00]) for i in range(nc)) + bytes([1, 0, 0])  # predictor 1
    head = b"\xff\xd8" + b"".join(marker + struct.pack(">H", 2 + len(body)) + body
                                  for marker, body in ((b"\xff\xc4", dht), (b"\xff\xc3", sof), (b"\xff\xda", sos)))
    pred = np.empty_like(img)
    pred[0, 0] = 1 << (bits - 1)
    pred[0, 1:], pred[1:, 0], pred[1:, 1:] = img[0, :-1], img[:-1, 0], img[1:, :-1]
    diff = (img - pred) % 65536
    diff = np.where(diff >= 32768, diff - 65536, diff)  # [-32768, 32767]
    writer = _Bits()
    for d in diff.ravel().tolist():
        size = 16 if d == -32768 else int(abs(d)).bit_length()
        writer.put(size, 5)
        if 0 < size < 16:
            writer.put(d if d > 0 else d - 1, size)
    return head + writer.flush() + b"\xff\xd9"


class _Bits:
    def __init__(self) -> None:
        self.acc, self.n, self.out = 0, 0, bytearray()

    def put(self, value: int, n: int) -> None:
        self.acc, self.n = (self.acc << n) | (value & ((1 << n) - 1)), self.n + n
        while self.n >= 8:
            self.n -= 8
            byte = (self.acc >> self.n) & 0xFF
            self.out += b"\xff\x00" if byte == 0xFF else bytes([byte])  # byte stuffing
        self.acc &= (1 << self.n) - 1

    def flush(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)  # pad with ones
        return bytes(self.out)
