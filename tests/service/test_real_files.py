"""Real files through the whole job flow (API upload against a real database, then ingest, strips and finalize
on the CPU): a linear DNG (LinearRaw, 3 samples) rendered without demosaicing, and a Bayer DNG from a camera
that is not a Phase One back."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile
from fastapi.testclient import TestClient
from PIL import Image

from lab.quality.stack_bench import delta_e_2000, srgb16_to_lab
from lab.synth.synth import synthesize_linear_shot
from services.config import get_settings
from services.db.models import Job
from services.db.session import session_scope
from services.jobs import flow
from services.pipeline.render import render_mosaic
from services.pipeline.shot import shot_render_params
from services.raw.decode import decode_raw
from services.raw.dng import write_dng
from services.raw.meta import snr_db
from services.stations import create_station_token
from services.storage import get_storage

# Low noise (the ISO 400 level of `strata quality`) on a dead-leaves scene, 320x240. The linear path's error is
# only the Lee filter's residual noise and its smoothing: measured 35.2 to 36.5 dB over seeds 0-4 (docs/QUALITY.md,
# "Linear DNGs"); the same render without denoise is about 2 dB lower. 32 dB leaves 3 dB for other seeds and
# machines while still failing a wrong level or colour: black level ignored 30.1 dB, identity matrix 20.9 dB,
# no white balance 13.7 dB.
PSNR_FLOOR_DB = 32.0
# A grey patch stays grey: CIEDE2000 against the ground truth, and its own chroma (a*, b*). A just noticeable
# difference is about 1; the noise-free render under tungsten measured 0.03 (chroma 0.02), so 1.0 is generous.
GREY_DELTA_E = 1.0


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def auth(client: TestClient) -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {create_station_token(session, 'real-files')}"}


def _submit(client: TestClient, auth: dict[str, str], path: Path, recipes: str = "tiff16") -> dict:
    r = client.post("/v1/jobs", headers=auth, files=[("frames", (path.name, path.read_bytes()))],
                    data={"recipe": recipes})
    assert r.status_code == 202, r.text
    return r.json()


def _run(job_id: str, n_workers: int = 3) -> int:
    """Ingest, every phase's shards (on the CPU), advance until done; returns how many shards ran."""

    storage, settings = get_storage(), get_settings()
    with session_scope() as session:
        tickets = flow.ingest_job(session, storage, settings, job_id, n_workers=n_workers)
    ran = 0
    while tickets:
        for t in tickets:
            with session_scope() as session:
                flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")
            ran += 1
        with session_scope() as session:
            tickets = flow.advance_job(session, storage, settings, job_id)
    return ran


def _outputs(job_id: str) -> dict[str, bytes]:
    storage = get_storage()
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.status == "done", None if job is None else job.error
        return {o.recipe or "": storage.local_path(o.storage_key).read_bytes() for o in job.outputs}


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / np.mean((a / 65535.0 - b / 65535.0) ** 2)))


def test_a_linear_dng_renders_close_to_its_ground_truth(client: TestClient, auth: dict[str, str],
                                                         tmp_path: Path) -> None:
    shot = synthesize_linear_shot(tmp_path / "lin", width=320, height=240, seed=0, noise="low")
    job = _submit(client, auth, shot.files[0], "tiff16,jpeg-proof,tiff16-adobergb")
    assert job["camera"] == "IQ3_S" and job["source_camera"]["layout"] == "linear"
    assert job["source_camera"]["make"] == "Acme"
    assert _run(job["id"]) >= 3  # strips
    outs = _outputs(job["id"])
    rendered = tifffile.imread(io.BytesIO(outs["tiff16"]))
    truth = tifffile.imread(shot.ground_truth)
    assert rendered.shape == truth.shape and rendered.dtype == np.uint16
    assert _psnr(rendered, truth) > PSNR_FLOOR_DB
    # Strips are exact: the stitched file is the whole-frame render, bit for bit.
    meta = decode_raw(shot.files[0], tmp_path / "whole.npy")
    image = np.load(tmp_path / "whole.npy")
    assert meta.is_linear and image.shape == (240, 320, 3)
    np.testing.assert_array_equal(rendered, render_mosaic(image, shot_render_params(meta, image, "srgb")))
    assert tifffile.imread(io.BytesIO(outs["tiff16-adobergb"])).shape == truth.shape
    with Image.open(io.BytesIO(outs["jpeg-proof"])) as im:
        assert im.size == (320, 240) and im.getexif()[271] == "Acme"
    assert client.get(f"/v1/jobs/{job['id']}/preview", headers=auth).status_code == 200


def _grey_chart(path: Path) -> list[tuple[slice, slice]]:
    """An sRGB chart: six grey patches (8-bit 40..240) over a colour background; returns the patches' inner
    boxes (away from the blur of the synthesiser and the filter's window)."""
    chart = np.zeros((240, 320, 3), np.uint8)
    chart[..., 0], chart[..., 1], chart[..., 2] = 180, 90, 40
    boxes = []
    for i, level in enumerate((40, 80, 120, 160, 200, 240)):
        y, x = 30 + (i // 3) * 100, 20 + (i % 3) * 100
        chart[y : y + 80, x : x + 80] = level
        boxes.append((slice(y + 12, y + 68), slice(x + 12, x + 68)))
    Image.fromarray(chart).save(path)
    return boxes


def test_a_linear_dngs_grey_stays_grey(client: TestClient, auth: dict[str, str], tmp_path: Path) -> None:
    boxes = _grey_chart(tmp_path / "chart.png")
    shot = synthesize_linear_shot(tmp_path / "chart", width=320, height=240, noise="none",
                                  content=str(tmp_path / "chart.png"), white=(0.4476, 0.4074))  # tungsten
    job = _submit(client, auth, shot.files[0])
    _run(job["id"])
    rendered = tifffile.imread(io.BytesIO(_outputs(job["id"])["tiff16"]))
    truth = tifffile.imread(shot.ground_truth)
    for ys, xs in boxes:
        got = srgb16_to_lab(rendered[ys, xs].reshape(-1, 3).mean(axis=0, keepdims=True)[None])
        want = srgb16_to_lab(truth[ys, xs].reshape(-1, 3).mean(axis=0, keepdims=True)[None])
        assert float(delta_e_2000(got, want).max()) < GREY_DELTA_E
        assert abs(float(got[..., 1].max())) < GREY_DELTA_E and abs(float(got[..., 2].max())) < GREY_DELTA_E


@pytest.mark.one_backend
def test_a_bayer_dng_from_any_camera_renders_as_a_single_frame(client: TestClient, auth: dict[str, str],
                                                               synth_dir: Path, tmp_path: Path) -> None:
    source = synth_dir / "iq3s" / "frame_00.dng"
    meta = decode_raw(source, tmp_path / "m.npy")
    path = tmp_path / "DSC01234.dng"
    write_dng(path, np.load(tmp_path / "m.npy"), cfa=meta.cfa, black_level=int(meta.black_levels[0]),
              white_level=int(meta.white_level), profile=meta.profile, as_shot_neutral=meta.as_shot_neutral or (),
              make="Sony", model="ILCE-7RM5", noise_profile=meta.noise_profile)
    job = _submit(client, auth, path)
    assert job["camera"] == "IQ3_S"
    assert job["source_camera"] == {"make": "Sony", "model": "ILCE-7RM5", "layout": "bayer"}
    _run(job["id"])
    rendered = tifffile.imread(io.BytesIO(_outputs(job["id"])["tiff16"]))
    assert rendered.shape == (meta.height, meta.width, 3)
    got = client.get(f"/v1/jobs/{job['id']}", headers=auth).json()
    assert got["status"] == "done" and got["source_camera"]["model"] == "ILCE-7RM5"


def test_a_recipe_picks_the_fast_or_max_model_and_the_default_is_the_best(client: TestClient, auth: dict[str, str],
                                                                   synth_dir: Path) -> None:
    """The shot's package is chosen at ingest from its recipes' tier: `tiff16-fast` renders with the fast package,
    `tiff16-max` (beside a fast one: the most thorough wins) with the best one averaged over four orientations,
    a plain job with the best one, and each job's outputs come from its own package."""
    source = synth_dir / "iq3s" / "frame_00.dng"
    models = {}
    for recipes in ("tiff16", "tiff16-fast,jpeg-proof", "tiff16-max,tiff16-fast"):
        job = _submit(client, auth, source, recipes)
        with session_scope() as session:
            flow.ingest_job(session, get_storage(), get_settings(), job["id"], n_workers=1)
            render = session.get(Job, job["id"]).params["render"]
            models[recipes] = (render["model"], render["orientations"])
    clean = snr_db(render["noise_shot"], render["noise_read"]) >= 24.0  # best turns a clean frame twice
    assert models == {"tiff16": ("strata_jdd_v2.strata", 2 if clean else 1),
                      "tiff16-fast,jpeg-proof": ("iq3s_denoise_v2.strata", 1),
                      "tiff16-max,tiff16-fast": ("strata_jdd_v2.strata", 4)}  # max: the best package, 4 ways
