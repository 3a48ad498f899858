"""A DNG whose colour tag is not numeric (found by the upload fuzzer): the fast path leaves it to the LibRaw
child, which reports a reason; nothing raises out of the decoder but a RawError."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from lab.fuzz.mutate import _ifd_entries
from services.errors import RawError
from services.raw.decode import decode_raw

FORWARD_MATRIX_1 = 50964


def test_non_numeric_colour_tag_is_a_raw_error_not_a_crash(tmp_path: Path) -> None:
    from lab.synth.synth import synthesize_shot

    synthesize_shot("IQ3_S", tmp_path / "shot", scale=0.05, seed=3, noise=0.0005)
    data = bytearray((tmp_path / "shot" / "frame_00.dng").read_bytes())
    entries = [e for e in _ifd_entries(bytes(data)) if struct.unpack("<H", data[e:e + 2])[0] == FORWARD_MATRIX_1]
    if not entries:
        pytest.skip("the synthetic DNG carries no ForwardMatrix1 in IFD0")
    data[entries[0] + 2:entries[0] + 4] = struct.pack("<H", 2)  # ASCII instead of SRATIONAL
    bad = tmp_path / "bad.dng"
    bad.write_bytes(bytes(data))
    try:
        decode_raw(bad, tmp_path / "out.npy", timeout_s=60)
    except RawError as exc:
        assert exc.reason


def test_a_tiff_structure_parsed_into_nonsense_is_bad_raw_file(synth_dir: Path) -> None:
    """Mutant 515 of seed 7 (a tag mutation): tifffile gives a tuple for the image width; the probe said
    TypeError (a 500 at upload), now BadRawFile (422)."""
    import io
    import itertools

    from lab.fuzz.mutate import mutants
    from services.errors import BadRawFile
    from services.raw.probe import probe_raw

    data = (synth_dir / "iq3s" / "frame_00.dng").read_bytes()
    mutant = next(itertools.islice(mutants(data, 516, seed=7), 515, None))
    try:
        probe_raw(io.BytesIO(mutant.data))
    except BadRawFile as exc:
        assert exc.reason.startswith("not a RAW file")
