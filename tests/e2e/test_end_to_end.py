"""End to end through real parts: uvicorn API, real Redis, real Celery worker processes (coordinators and two
GPU-queue workers on the CPU; the stack tests/e2e/conftest.py shares with the other modules that only use it),
synthetic DNGs from `strata synth` that LibRaw decodes."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tifffile

from tests.conftest import psnr
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e

# PSNR floor against the ground truth, for the low-noise synthetic shots (noise 0.0005) at 0.1 scale. The
# pipeline reaches ~35 dB noise-free on this content (Malvar demosaic); a real fault lands far below 25 dB:
# a wrong CFA phase or white balance ~15-20 dB, a one-pixel stack misregistration or a colour-matrix error
# ~20-24 dB. 30 dB leaves room for noise and the demosaic while catching every one of those.
MIN_PSNR_DB = 30.0


def _synth(out: Path, camera: str, *extra: str) -> list[Path]:
    """Synthesise a shot through the real command line."""
    cmd = [sys.executable, "-m", "cli.main", "synth", "--camera", camera, "--out", str(out), "--scale", "0.1",
           "--noise", "0.0005", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [Path(line) for line in done.stdout.split() if line.endswith(".dng")]


@pytest.fixture(scope="session")  # not "module": this module's tests run in two groups, one per backend's stack
def shots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("shots")
    return {"IQ3_S": _synth(root / "iq3s", "IQ3_S", "--seed", "11"),
            "IQ2_XS": _synth(root / "iq2xs", "IQ2_XS", "--frames", "4", "--seed", "12")}


def _submit(stack: Stack, files: list[Path], **fields: str | list[str]) -> dict:
    with httpx.Client(base_url=stack.url, headers=stack.headers, timeout=60) as c:
        r = c.post("/v1/jobs", files=[("frames", (p.name, p.read_bytes())) for p in files], data=fields)
    assert r.status_code == 202, r.text
    return r.json()


def _wait(stack: Stack, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=stack.url, headers=stack.headers, timeout=30) as c:
        while time.monotonic() < deadline:
            job = c.get(f"/v1/jobs/{job_id}").json()
            if job["status"] not in ("queued", "running"):
                return job
            time.sleep(0.2)
    pytest.fail(f"job {job_id} did not finish: {job}")


def _download(stack: Stack, job: dict) -> tuple[bytes, np.ndarray]:
    out = job["outputs"][0]
    data = httpx.get(stack.url + out["url"], headers=stack.headers, timeout=60).content
    assert hashlib.sha256(data).hexdigest() == out["sha256"] and len(data) == out["bytes"]
    return data, tifffile.imread(io.BytesIO(data))


def _ground_truth(files: list[Path]) -> np.ndarray:
    return tifffile.imread(files[0].parent / "ground_truth.tif")


def _check_tiff(data: bytes, image: np.ndarray, truth: np.ndarray) -> float:

    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        assert page.bitspersample == 16 and page.samplesperpixel == 3 and page.is_tiled
        assert page.tags.get(34675) is not None  # ICC profile embedded
    assert image.dtype == np.uint16 and image.shape == truth.shape
    return psnr(image / 65535.0, truth / 65535.0)


def test_iq3s_frame_end_to_end(stack: Stack, shots: dict[str, list[Path]]) -> None:
    job = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    assert job["status"] == "done", job["error"]
    assert job["camera"] == "IQ3_S" and job["progress"] == 1.0
    strips = [s for s in job["shards"] if s["kind"] == "strip"]
    assert len(strips) >= 2 and all(s["status"] == "done" for s in strips)
    if stack.env["STRATA_GPU_EXPRESS_LANE"] == "0":  # with the lane, one worker's pool and lane may take both
        assert len({s["worker"] for s in strips}) == 2, "both GPU-queue workers should have taken strips"
    data, image = _download(stack, job)
    assert _check_tiff(data, image, _ground_truth(shots["IQ3_S"])) > MIN_PSNR_DB


def test_iq2xs_stack_end_to_end(stack: Stack, shots: dict[str, list[Path]]) -> None:
    job = _wait(stack, _submit(stack, shots["IQ2_XS"])["id"])
    assert job["status"] == "done", job["error"]
    assert job["camera"] == "IQ2_XS"
    groups = [s for s in job["shards"] if s["kind"] == "frame_group"]
    assert len(groups) == 2
    if stack.env["STRATA_GPU_EXPRESS_LANE"] == "0":  # with the lane, one worker's pool and lane may take both
        assert len({s["worker"] for s in groups}) == 2
    data, image = _download(stack, job)
    assert _check_tiff(data, image, _ground_truth(shots["IQ2_XS"])) > MIN_PSNR_DB


def test_cli_submit_uploads_waits_and_downloads(stack: Stack, shots: dict[str, list[Path]], tmp_path: Path) -> None:
    """`strata submit`'s client: upload with progress, wait for the job, download and verify the TIFF."""
    from rich.console import Console

    from cli.client import submit_shot

    token = stack.headers["Authorization"].removeprefix("Bearer ")
    out = io.StringIO()
    saved = submit_shot(stack.url, token, shots["IQ2_XS"], camera=None, recipe="tiff16", priority="batch",
                        wait=True, out_dir=tmp_path / "out", timeout=120, console=Console(file=out, width=100))
    assert [p.name for p in saved] == ["frame_00.tif"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["frame_00.tif"]  # no .part left behind
    assert "render: done" in out.getvalue() and "100%" in out.getvalue() and "download frame_00.tif" in out.getvalue()
    image = tifffile.imread(saved[0])
    assert psnr(image / 65535.0, _ground_truth(shots["IQ2_XS"]) / 65535.0) > MIN_PSNR_DB


def test_cli_jobs_list_show_download_cancel(stack: Stack, shots: dict[str, list[Path]], tmp_path: Path) -> None:
    """`strata jobs`: the station's jobs in a table, one job's shards, its outputs downloaded, a cancel."""
    from typer.testing import CliRunner

    from cli.main import app

    token = stack.headers["Authorization"].removeprefix("Bearer ")
    auth = ["--api", stack.url, "--token", token]
    done = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    runner = CliRunner()
    listed = runner.invoke(app, ["jobs", "list", "--status", "done", *auth], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert done["id"] in listed.output and "frame_00.tif" in listed.output
    shown = runner.invoke(app, ["jobs", "show", done["id"], *auth], terminal_width=200)
    assert shown.exit_code == 0 and "strip" in shown.output and done["outputs"][0]["sha256"] in shown.output
    got = runner.invoke(app, ["jobs", "download", done["id"], "--out", str(tmp_path), *auth])
    assert got.exit_code == 0, got.output
    assert (tmp_path / "frame_00.tif").read_bytes() == _download(stack, done)[0]
    missing = runner.invoke(app, ["jobs", "show", "no-such-job", *auth])
    assert missing.exit_code != 0 and "404" in missing.output
    queued = _submit(stack, shots["IQ3_S"], priority="batch")
    cancelled = runner.invoke(app, ["jobs", "cancel", queued["id"], *auth])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    assert _wait(stack, queued["id"])["status"] == "cancelled"


@pytest.mark.one_backend
def test_stitched_strips_equal_the_one_piece_render(stack: Stack, shots: dict[str, list[Path]]) -> None:
    """The TIFF the service stitched from strips equals rendering the whole frame at once (≤ 1 LSB)."""
    from services.pipeline.render import render_mosaic
    from services.pipeline.shot import shot_render_params
    from services.raw.decode import decode_raw

    job = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    _, image = _download(stack, job)
    tmp = shots["IQ3_S"][0].parent / "whole.npy"
    meta = decode_raw(shots["IQ3_S"][0], tmp)
    mosaic = np.load(tmp)
    whole = render_mosaic(mosaic, shot_render_params(meta, mosaic), device="cpu")
    assert int(np.abs(whole.astype(np.int32) - image.astype(np.int32)).max()) <= 1


def test_range_download(stack: Stack, shots: dict[str, list[Path]]) -> None:
    job = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    url = stack.url + job["outputs"][0]["url"]
    full = httpx.get(url, headers=stack.headers).content
    part = httpx.get(url, headers={**stack.headers, "Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == full[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(full)}"
    tail = httpx.get(url, headers={**stack.headers, "Range": "bytes=-10"})
    assert tail.content == full[-10:]
    bad = httpx.get(url, headers={**stack.headers, "Range": f"bytes={len(full) + 5}-"})
    assert bad.status_code == 416 and bad.json()["type"] == "range_not_satisfiable"
    assert bad.headers["content-range"] == f"bytes */{len(full)}"
    head = httpx.head(url, headers=stack.headers)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(full) and not head.content


def test_undecodable_raw_fails_the_job_with_a_reason(stack: Stack, tmp_path: Path, shots: dict[str, list[Path]]
                                                     ) -> None:
    """A RAW that passes the upload check but that LibRaw cannot decode (a RAF: the probe reads only its
    signature) fails its job; a DNG whose CFA the probe can read as one Strata cannot render is refused at upload
    instead (issue 17); workers keep serving."""
    bad = tmp_path / "bad_cfa.dng"
    data = bytearray(shots["IQ3_S"][0].read_bytes())
    with tifffile.TiffFile(shots["IQ3_S"][0]) as tif:
        tag = tif.pages[0].tags["CFAPattern"]
        data[tag.valueoffset:tag.valueoffset + 4] = bytes([9, 9, 9, 9])  # colours that do not exist
    with httpx.Client(base_url=stack.url, headers=stack.headers, timeout=60) as c:
        r = c.post("/v1/jobs", files=[("frames", (bad.name, bytes(data)))])
    assert r.status_code == 422 and r.json()["type"] == "unsupported_sensor", r.text
    broken = tmp_path / "broken.raf"
    noise = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    broken.write_bytes(b"FUJIFILMCCD-RAW 0201FF383501" + b"X-T5".ljust(32, b"\0") + noise)
    job = _wait(stack, _submit(stack, [broken])["id"])
    assert job["status"] == "failed"
    assert job["error"].startswith("decode failed:") and "LibRaw" in job["error"]
    again = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    assert again["status"] == "done"


def test_worker_killed_mid_shard_job_completes_identically(stack: Stack, shots: dict[str, list[Path]]) -> None:
    from workers.registry import live_workers, redis_client

    reference = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    ref_data, ref_image = _download(stack, reference)

    job_id = _submit(stack, shots["IQ3_S"])["id"]
    victim = None
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=stack.url, headers=stack.headers, timeout=30) as c:
        while victim is None and time.monotonic() < deadline:
            job = c.get(f"/v1/jobs/{job_id}").json()
            running = [s for s in job["shards"] if s["status"] == "running" and s["worker"]]
            if running:
                victim = running[0]["worker"]
            else:
                time.sleep(0.05)
    assert victim, "no shard was seen running"
    info = {w.name: w for w in live_workers(redis_client(stack.redis_url))}[victim]
    os.kill(info.pid, signal.SIGKILL)  # no chance to clean up or acknowledge

    job = _wait(stack, job_id, timeout=180)
    assert job["status"] == "done", job["error"]
    assert any(s["attempts"] >= 2 for s in job["shards"]), "the killed shard should have run again"
    data, image = _download(stack, job)
    assert np.array_equal(image, ref_image)
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(ref_data).hexdigest()


@pytest.mark.one_backend
def test_two_recipes_from_one_render(stack: Stack, shots: dict[str, list[Path]], tmp_path: Path) -> None:
    """A deflate TIFF and a JPEG proof of one shot: both listed with their recipe, each download matches its
    sha256, the GPU work ran once (the same strip shards as a one-recipe job), EXIF reads back in exiftool."""
    import json
    import shutil

    from PIL import Image

    single = _wait(stack, _submit(stack, shots["IQ3_S"])["id"])
    job = _wait(stack, _submit(stack, shots["IQ3_S"], recipe=["tiff16", "jpeg-proof"])["id"])
    assert job["status"] == "done", job["error"]
    assert job["recipes"] == ["tiff16", "jpeg-proof"]
    assert [(o["recipe"], o["name"], o["media_type"]) for o in job["outputs"]] == [
        ("tiff16", "frame_00.tif", "image/tiff"), ("jpeg-proof", "frame_00_jpeg-proof.jpg", "image/jpeg")]
    strips = [(s["phase"], s["index"]) for s in job["shards"]]
    assert len(strips) == len(set(strips)) == len(single["shards"]) and all(s["kind"] == "strip" for s in job["shards"])
    files = []
    for out in job["outputs"]:
        data = httpx.get(stack.url + out["url"], headers=stack.headers, timeout=60).content
        assert hashlib.sha256(data).hexdigest() == out["sha256"] and len(data) == out["bytes"]
        files.append(tmp_path / out["name"])
        files[-1].write_bytes(data)
    assert files[0].read_bytes() == _download(stack, single)[0]  # the TIFF is the one-recipe job's, byte for byte
    with tifffile.TiffFile(files[0]) as tif:
        assert tif.pages[0].compression == 8 and tif.pages[0].predictor == 2
    with Image.open(files[1]) as im:
        assert im.format == "JPEG" and im.getexif()[271] == "Phase One"
    if shutil.which("exiftool") is None:
        pytest.skip("exiftool (libimage-exiftool-perl) not installed")
    tags = json.loads(subprocess.run(["exiftool", "-j", "-n", *map(str, files)], capture_output=True, text=True,
                                     check=True).stdout)
    for t in tags:
        assert (t["Make"], t["Model"], t["DateTimeOriginal"], t["ISO"]) == (
            "Phase One", "IQ3_S", "2026:11:30 14:05:09", 100), t["SourceFile"]
        assert t["FNumber"] == 8 and t["FocalLength"] == 80 and t["XResolution"] == 300
