"""Mutations of a valid DNG for upload fuzzing: bit flips, truncations and TIFF tag-value mutations (counts,
values and offsets of IFD entries set to edge values), deterministic for a seed (OSS-Fuzz style corpus mutation).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass

EDGE_VALUES = (0, 1, 2, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF)


@dataclass(frozen=True)
class Mutant:
    kind: str  # bitflip | truncate | tag
    data: bytes


def _ifd_entries(data: bytes) -> list[int]:
    """Offsets of IFD0's 12-byte entries (empty when the header is not TIFF)."""
    if len(data) < 8 or data[:2] not in (b"II", b"MM"):
        return []
    end = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(end + "I", data[4:8])
    if ifd + 2 > len(data):
        return []
    (count,) = struct.unpack(end + "H", data[ifd:ifd + 2])
    return [ifd + 2 + 12 * i for i in range(count) if ifd + 2 + 12 * (i + 1) <= len(data)]


def bit_flips(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 4, 32))):
        pos = rng.randrange(min(len(out), 4096) if rng.random() < 0.7 else len(out))  # headers, mostly
        out[pos] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.choice((0, 4, 8, 64, 512, rng.randrange(len(data)), len(data) - 1))]


def tag_value(data: bytes, rng: random.Random) -> bytes:
    entries = _ifd_entries(data)
    if not entries:
        return bit_flips(data, rng)
    out = bytearray(data)
    end = "<" if data[:2] == b"II" else ">"
    for _ in range(rng.choice((1, 2, 4))):
        entry = rng.choice(entries)
        field = rng.choice(("type", "count", "value"))
        if field == "type":
            out[entry + 2:entry + 4] = struct.pack(end + "H", rng.choice((0, 1, 3, 4, 5, 12, 13, 99)))
        else:
            at = entry + (4 if field == "count" else 8)
            value = rng.choice(EDGE_VALUES + (len(data), len(data) - 1, rng.randrange(1 << 32)))
            out[at:at + 4] = struct.pack(end + "I", value)
    return bytes(out)


MUTATORS = {"bitflip": bit_flips, "truncate": truncate, "tag": tag_value}


def mutants(data: bytes, n: int, seed: int = 0) -> Iterator[Mutant]:
    """``n`` mutants of ``data``, the three kinds in turn."""
    rng = random.Random(seed)
    kinds = list(MUTATORS)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        yield Mutant(kind, MUTATORS[kind](data, rng))
