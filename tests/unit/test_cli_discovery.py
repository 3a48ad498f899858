"""Which files the capture-station commands send and how they group into shots; when the hot folder takes a file
as complete; its state file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli.discovery import Shot, discover, is_candidate, plan_shots
from cli.watch import STATE_NAME, Settler, WatchState


def _touch(path: Path, data: bytes = b"raw") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_folders_are_searched_recursively_for_raw_extensions_in_any_case(tmp_path: Path) -> None:
    for name in ("a.dng", "b.IIQ", "sub/c.NEF", "sub/deep/d.cr3", "e.ARW", "f.3fr", "notes.txt", "g.tif",
                 ".hidden.dng", "~h.dng", "i.dng.part", "j.tmp", ".cache/k.dng", "l.iiq.tmp"):
        _touch(tmp_path / name)
    found = [p.relative_to(tmp_path).as_posix() for p, _ in discover([tmp_path])]
    assert found == ["a.dng", "b.IIQ", "e.ARW", "f.3fr", "sub/c.NEF", "sub/deep/d.cr3"]
    assert [rel.as_posix() for _, rel in discover([tmp_path])] == [".", ".", ".", ".", "sub", "sub/deep"]
    assert not is_candidate(Path("x.DNG.PART")) and is_candidate(Path("x.Srw")) and is_candidate(Path("x.rw2"))


def test_a_file_given_twice_or_inside_a_given_folder_is_one_shot(tmp_path: Path) -> None:
    a = _touch(tmp_path / "a.dng")
    _touch(tmp_path / "b.dng")
    shots = plan_shots([a, tmp_path, a])
    assert [s.files for s in shots] == [(a,), (tmp_path / "b.dng",)]
    assert shots[0].rel_dir == Path(".")


def test_each_file_is_a_single_shot_by_default_even_with_frame_numbers(tmp_path: Path) -> None:
    files = [_touch(tmp_path / f"set_{i:02d}.dng") for i in range(4)]
    assert [s.files for s in plan_shots([tmp_path])] == [(f,) for f in files]


def test_stack_flag_makes_every_file_one_stack(tmp_path: Path) -> None:
    files = [_touch(tmp_path / n) for n in ("x.dng", "y.dng", "z.dng")]
    assert plan_shots([tmp_path], stack=True) == [Shot(tuple(files), Path("."))]


def test_stacks_by_name_groups_consecutive_runs_of_2_to_16_frames(tmp_path: Path) -> None:
    four = [_touch(tmp_path / f"stack_{i:02d}.IIQ") for i in range(1, 5)]  # one stack of 4
    dashed = [_touch(tmp_path / f"pano-{i:03d}.dng") for i in (7, 8)]  # 2 frames, the dash rule
    gap = [_touch(tmp_path / f"gap_{i:02d}.dng") for i in (1, 2, 4, 5)]  # two runs of 2
    lone = _touch(tmp_path / "lone_09.dng")  # a run of one: a single shot
    long_run = [_touch(tmp_path / "long" / f"l_{i:02d}.dng") for i in range(17)]  # over 16: single shots
    plain = _touch(tmp_path / "portrait.dng")
    other = [_touch(tmp_path / "b" / f"stack_{i:02d}.IIQ") for i in (5, 6)]  # another folder: another stack
    shots = {s.files for s in plan_shots([tmp_path], stacks_by_name=True)}
    expected = {tuple(four), tuple(dashed), tuple(gap[:2]), tuple(gap[2:]), (lone,), (plain,), tuple(other)}
    expected |= {(f,) for f in long_run}
    assert shots == expected


def test_stacks_by_name_keeps_frame_order_by_number_and_extensions_apart(tmp_path: Path) -> None:
    _touch(tmp_path / "s_10.dng")
    _touch(tmp_path / "s_09.dng")
    _touch(tmp_path / "s_11.nef")
    shots = plan_shots([tmp_path], stacks_by_name=True)
    assert [[p.name for p in s.files] for s in shots] == [["s_09.dng", "s_10.dng"], ["s_11.nef"]]


def _stat(path: Path, size: int, mtime: float) -> os.stat_result:
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))
    return path.stat()


def test_a_file_is_complete_once_size_and_mtime_stayed_put_for_settle_seconds(tmp_path: Path) -> None:
    f = tmp_path / "a.dng"
    settler = Settler(settle=2.0)
    assert not settler.observe("a.dng", _stat(f, 10, 1000.0), now=1000.0)  # first sight
    assert not settler.observe("a.dng", _stat(f, 20, 1001.0), now=1001.0)  # still growing
    assert not settler.observe("a.dng", _stat(f, 20, 1001.0), now=1002.5)  # same, but only 1.5 s
    assert settler.observe("a.dng", _stat(f, 20, 1001.0), now=1003.0)  # same for 2 s
    assert not settler.observe("a.dng", _stat(f, 20, 1004.0), now=1004.0)  # rewritten: the clock restarts
    assert settler.observe("a.dng", _stat(f, 20, 1004.0), now=1006.0)


def test_the_state_file_is_written_atomically_and_read_back(tmp_path: Path) -> None:
    state = WatchState(tmp_path)
    assert state.load().files == {}
    f = tmp_path / "a.dng"
    st = _stat(f, 5, 1234.5)
    state.files["a.dng"] = {"size": 5, "mtime": st.st_mtime, "mtime_ns": st.st_mtime_ns, "sha256": "ab",
                            "job": "j1", "status": "queued", "saved": [], "error": None}
    state.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_NAME, "a.dng"]  # no temporary file left
    body = json.loads((tmp_path / STATE_NAME).read_text())
    assert body["version"] == 1 and body["files"]["a.dng"]["job"] == "j1"
    again = WatchState(tmp_path).load()
    assert again.files == state.files and again.unchanged("a.dng", f.stat())
    assert not again.unchanged("a.dng", _stat(f, 6, 1234.5)) and not again.unchanged("b.dng", f.stat())
