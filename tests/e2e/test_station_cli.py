"""The capture-station commands as a studio runs them, as real processes against the real service (API, Redis,
coordinator, CPU workers): `strata submit` of a folder with --json, `strata watch` on a file copied in slowly and
across a restart, and a service that is down when the command starts."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import tifffile

from tests.e2e.conftest import Stack  # the real service's fixture `stack`: tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


def _shot(out: Path, seed: int) -> Path:
    from lab.synth.synth import synthesize_shot

    return Path(synthesize_shot("IQ3_S", out, scale=0.05, seed=seed, noise=0.0005).files[0])


def _cli(svc: Stack, *args: str) -> list[str]:
    token = svc.headers["Authorization"].removeprefix("Bearer ")
    return [sys.executable, "-m", "cli.main", *args, "--api", svc.url, "--token", token]


def _job_ids(svc: Stack) -> set[str]:
    r = httpx.get(f"{svc.url}/v1/jobs", params={"limit": 200}, headers=svc.headers, timeout=30)
    return {j["id"] for j in r.json()["jobs"]}


def test_submit_a_folder_of_two_shots_with_json(stack: Stack, tmp_path: Path) -> None:
    _shot(tmp_path / "in" / "a", seed=21)
    _shot(tmp_path / "in" / "b", seed=22)
    done = subprocess.run(_cli(stack, "submit", str(tmp_path / "in"), "--json", "--out", str(tmp_path / "out"),
                               "--timeout", "180"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shots = json.loads(done.stdout)  # stdout holds the JSON and nothing else
    assert [s["status"] for s in shots] == ["done", "done"] and len({s["job"] for s in shots}) == 2
    assert [s["paths"] for s in shots] == [[str(tmp_path / "out" / d / "frame_00.tif")] for d in ("a", "b")]
    for s in shots:
        data = Path(s["paths"][0]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["outputs"][0]["sha256"]
        assert tifffile.imread(s["paths"][0]).dtype.name == "uint16"
    assert "upload 2 shot(s)" in done.stderr


def test_submit_stacks_by_name_sends_a_named_run_as_one_stack(stack: Stack, tmp_path: Path) -> None:
    from lab.synth.synth import synthesize_shot

    frames = synthesize_shot("IQ2_XS", tmp_path / "in", scale=0.05, frames=3, seed=23, noise=0.0005).files
    assert [Path(f).name for f in frames] == ["frame_00.dng", "frame_01.dng", "frame_02.dng"]
    done = subprocess.run(_cli(stack, "submit", str(tmp_path / "in"), "--stacks-by-name", "--json", "--out",
                               str(tmp_path / "out"), "--timeout", "180"), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    [shot] = json.loads(done.stdout)
    assert shot["camera"] == "IQ2_XS" and len(shot["files"]) == 3 and shot["status"] == "done"
    assert Path(shot["paths"][0]).name == "frame_00.tif"


def _copy_slowly(src: Path, dest: Path, chunks: int, pause: float, finished: list[float]) -> None:
    data = src.read_bytes()
    step = len(data) // chunks + 1
    with open(dest, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(pause)
    finished.append(time.time())


def _wait_for(path: Path, proc: subprocess.Popen[str], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path.name} did not appear; watcher log:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def test_watch_takes_a_slow_copy_once_complete_and_resends_nothing_after_a_restart(
        stack: Stack, tmp_path: Path) -> None:
    hot, log = tmp_path / "hot", tmp_path / "watch.log"
    hot.mkdir()
    src_a, src_b = _shot(tmp_path / "src_a", seed=31), _shot(tmp_path / "src_b", seed=32)
    before = _job_ids(stack)
    with open(log, "w") as logf:
        proc = subprocess.Popen(_cli(stack, "watch", str(hot), "--interval", "0.3", "--settle", "1.5"),
                                stdout=logf, stderr=subprocess.STDOUT, text=True)
    finished: list[float] = []
    writer = threading.Thread(target=_copy_slowly, args=(src_a, hot / "a.dng", 8, 0.5, finished))
    writer.start()
    _wait_for(hot / "a.tif", proc, log)
    writer.join()
    _stop(proc)
    state = json.loads((hot / ".strata-watch.json").read_text())["files"]
    job_a = state["a.dng"]["job"]
    assert _job_ids(stack) - before == {job_a}, "the slow copy must be sent exactly once"
    job = httpx.get(f"{stack.url}/v1/jobs/{job_a}", headers=stack.headers, timeout=30).json()
    assert job["frames"][0]["sha256"] == hashlib.sha256(src_a.read_bytes()).hexdigest()  # the whole file
    created = dt.datetime.fromisoformat(job["created_at"].replace("Z", "+00:00")).timestamp()
    assert created >= finished[0], "uploaded before the copy had finished"
    assert tifffile.imread(hot / "a.tif").dtype.name == "uint16"

    shutil.copy(src_b, hot / "b.dng")  # while the watcher is down
    again = subprocess.run(_cli(stack, "watch", str(hot), "--once", "--settle", "0.5", "--timeout", "180"),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (hot / "b.tif").exists()
    state = json.loads((hot / ".strata-watch.json").read_text())["files"]
    assert state["a.dng"]["job"] == job_a and state["b.dng"]["status"] == "done"
    assert _job_ids(stack) - before == {job_a, state["b.dng"]["job"]}, "a.dng must not be sent again"


def _wide() -> dict[str, str]:
    """The environment with a console wide enough that a message is not broken where a test looks for it."""
    return {**os.environ, "COLUMNS": "300"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_service_exits_3_with_retry_messages(stack: Stack, tmp_path: Path) -> None:
    shot = _shot(tmp_path / "s", seed=41)
    url = f"http://127.0.0.1:{_closed_port()}"
    cmd = [*_cli(stack, "submit", str(shot))[:3], "--retry-for", "2", *_cli(stack, "submit", str(shot))[3:]]
    cmd[cmd.index("--api") + 1] = url
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - start < 30
    assert done.stderr.count(f"cannot reach the Strata API at {url}") >= 2 and "retrying" in done.stderr


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        b.close()


def _proxy(listen_port: int, target_port: int, stop: threading.Event) -> None:
    """A TCP forwarder: the service 'comes up' on ``listen_port`` once this starts."""
    server = socket.create_server(("127.0.0.1", listen_port))
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        upstream = socket.create_connection(("127.0.0.1", target_port))
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()
    server.close()


def test_a_service_down_at_start_is_waited_for_then_used(stack: Stack, tmp_path: Path) -> None:
    shot = _shot(tmp_path / "s", seed=42)
    port = _closed_port()
    cmd = _cli(stack, "submit", str(shot), "--out", str(tmp_path / "out"), "--timeout", "180")
    cmd[cmd.index("--api") + 1] = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    stop = threading.Event()
    threading.Thread(target=_proxy, args=(port, int(stack.url.rsplit(":", 1)[1]), stop), daemon=True).start()
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        stop.set()
    assert proc.returncode == 0, err
    assert "cannot reach the Strata API" in err and "retrying" in err
    assert (tmp_path / "out" / "frame_00.tif").exists() and out.strip() == str(tmp_path / "out" / "frame_00.tif")


def test_watch_rides_out_a_service_that_is_down_then_comes_up(stack: Stack, tmp_path: Path) -> None:
    hot, log = tmp_path / "hot", tmp_path / "watch.log"
    hot.mkdir()
    shutil.copy(_shot(tmp_path / "src", seed=43), hot / "c.dng")
    port = _closed_port()
    cmd = _cli(stack, "watch", str(hot), "--interval", "0.3", "--settle", "0.5")
    cmd[cmd.index("--api") + 1] = f"http://127.0.0.1:{port}"
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while "retrying" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "cannot reach the Strata API" in log.read_text() and not (hot / ".strata-watch.json").exists()
    stop = threading.Event()
    threading.Thread(target=_proxy, args=(port, int(stack.url.rsplit(":", 1)[1]), stop), daemon=True).start()
    try:
        _wait_for(hot / "c.tif", proc, log)
        _stop(proc)
    finally:
        stop.set()
    text = log.read_text()
    assert "files stay pending" in text and "the API answers again" in text
    assert json.loads((hot / ".strata-watch.json").read_text())["files"]["c.dng"]["status"] == "done"


def test_watch_started_while_the_api_is_down_stops_on_a_bad_recipe_and_records_nothing(
        stack: Stack, tmp_path: Path) -> None:
    """Found from outside: `--recipe tif16` with the API down at start (recipes not checked) recorded the file as
    refused (422 invalid_input); the restart with the right recipe sent nothing and exited 0."""
    hot, log = tmp_path / "hot", tmp_path / "watch.log"
    hot.mkdir()
    shutil.copy(_shot(tmp_path / "src", seed=44), hot / "c.dng")
    port = _closed_port()
    cmd = _cli(stack, "watch", str(hot), "--interval", "0.3", "--settle", "0.5", "--recipe", "tif16")
    cmd[cmd.index("--api") + 1] = f"http://127.0.0.1:{port}"
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, text=True, env=_wide())
    deadline = time.monotonic() + 60
    while "recipes not checked" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    stop = threading.Event()
    threading.Thread(target=_proxy, args=(port, int(stack.url.rsplit(":", 1)[1]), stop), daemon=True).start()
    try:
        assert proc.wait(timeout=120) == 2, log.read_text()
    finally:
        stop.set()
    said = " ".join(log.read_text().split())
    assert "refused the watcher's options: 422 invalid_input: unknown recipe" in said and "tif16" in said
    state = hot / ".strata-watch.json"
    assert not state.exists() or "c.dng" not in json.loads(state.read_text())["files"]
    again = subprocess.run(_cli(stack, "watch", str(hot), "--once", "--settle", "0.5", "--recipe", "tiff16",
                                "--timeout", "180"), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert tifffile.imread(hot / "c.tif").dtype.name == "uint16"


def test_watch_ends_an_entry_whose_outputs_were_removed(stack: Stack, tmp_path: Path) -> None:
    """Found from outside: outputs removed (`strata jobs remove-files`) before the watcher collected them were asked
    for again twice a second (410 gone) forever; `--once --timeout 15` ended with "1 job(s) still running"."""
    hot = tmp_path / "hot"
    hot.mkdir()
    shutil.copy(_shot(tmp_path / "src", seed=45), hot / "d.dng")
    first = subprocess.run(_cli(stack, "watch", str(hot), "--once", "--settle", "0.2", "--timeout", "0"),
                           capture_output=True, text=True, timeout=120)  # sends it, does not wait for it
    assert first.returncode == 1 and "still running" in first.stderr, first.stderr
    job_id = json.loads((hot / ".strata-watch.json").read_text())["files"]["d.dng"]["job"]
    deadline = time.monotonic() + 180
    while httpx.get(f"{stack.url}/v1/jobs/{job_id}", headers=stack.headers, timeout=30).json()["status"] != "done":
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.3)
    removed = subprocess.run(_cli(stack, "jobs", "remove-files", job_id), capture_output=True, text=True, timeout=60)
    assert removed.returncode == 0, removed.stderr
    start = time.monotonic()
    again = subprocess.run(_cli(stack, "watch", str(hot), "--once", "--settle", "0.2", "--timeout", "15"),
                           capture_output=True, text=True, timeout=120, env=_wide())
    said = " ".join(again.stderr.split())
    assert again.returncode == 1 and time.monotonic() - start < 14, said
    assert f"d.dng: the outputs of job {job_id} are gone from the service" in said and "still running" not in said
    entry = json.loads((hot / ".strata-watch.json").read_text())["files"]["d.dng"]
    assert entry["status"] == "gone" and "410 gone" in entry["error"] and not (hot / "d.tif").exists()


def test_a_file_name_that_is_not_utf8_renders_through_submit_and_watch(
        stack: Stack, tmp_path: Path) -> None:
    """Found from outside: `caf\\xe9.dng` (Latin-1 bytes) crashed both commands in httpx's multipart encoding; the
    watcher, having recorded nothing, crashed on it at every restart."""
    hot = tmp_path / "hot"
    hot.mkdir()
    raw = hot / os.fsdecode(b"caf\xe9.dng")
    shutil.copy(_shot(tmp_path / "src", seed=46), raw)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}  # a UTF-8 locale's stdout
    done = subprocess.run(_cli(stack, "submit", str(hot), "--json", "--out", str(tmp_path / "out"), "--timeout",
                               "180"), capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    [shot] = json.loads(done.stdout)
    assert shot["status"] == "done" and Path(shot["paths"][0]).parent == tmp_path / "out"
    assert tifffile.imread(shot["paths"][0]).dtype.name == "uint16"
    watched = subprocess.run(_cli(stack, "watch", str(hot), "--once", "--settle", "0.2", "--timeout", "180"),
                             capture_output=True, text=True, timeout=300, env=env)
    assert watched.returncode == 0, watched.stderr
    saved = json.loads((hot / ".strata-watch.json").read_text())["files"][raw.name]["saved"]
    assert [Path(p).parent for p in saved] == [hot] and tifffile.imread(saved[0]).dtype.name == "uint16"
