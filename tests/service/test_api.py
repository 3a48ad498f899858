"""The REST API against a real database (SQLite and PostgreSQL) and a real Redis; no workers needed."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile
from fastapi.testclient import TestClient

from services.config import get_settings
from services.db.session import session_scope
from services.jobs.storage_identity import MARKER_KEY
from services.raw.probe import RENDERED
from services.stations import create_station_token
from tests.raw_layouts import REFUSED, bayer_dng, linear_dng, lossless_jpeg_dng


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c


def _token(name: str) -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {create_station_token(session, name)}"}


@pytest.fixture
def auth(client: TestClient) -> dict[str, str]:
    return _token("station-a")


def _frame(synth_dir: Path) -> bytes:
    return (synth_dir / "iq3s" / "frame_00.dng").read_bytes()


def _storage_files() -> list[Path]:
    root = get_settings().resolved_storage_dir
    return [p for p in root.rglob("*") if p.is_file() and p.name != MARKER_KEY] if root.exists() else []


def _job_count(client: TestClient, auth: dict[str, str]) -> int:
    return len(client.get("/v1/jobs", headers=auth).json()["jobs"])


def test_health(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_openapi_documents_the_upload(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert {"frames", "camera", "recipe", "priority", "sha256"} <= set(body["properties"])


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc"])
def test_missing_or_bad_token_is_401(client: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    r = client.get("/v1/jobs", headers=headers)
    assert r.status_code == 401
    assert r.json()["type"] == "unauthorized"


def test_upload_creates_a_queued_job(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    data = _frame(synth_dir)
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("frame_00.dng", data))],
                    data={"sha256": hashlib.sha256(data).hexdigest(), "priority": "batch"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "queued" and job["camera"] == "IQ3_S" and job["priority"] == "batch"
    assert job["frames"] == [{"name": "frame_00.dng", "original_name": "frame_00.dng",
                              "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}]
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth).json()["id"] == job["id"]
    stored = [p for p in _storage_files() if p.name.endswith("frame_00.dng")]
    assert len(stored) == 1 and stored[0].read_bytes() == data


def test_stations_see_only_their_own_jobs(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    job = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))]).json()
    other = _token("station-b")
    assert client.get(f"/v1/jobs/{job['id']}", headers=other).status_code == 404
    assert client.get("/v1/jobs", headers=other).json()["jobs"] == []
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=other).status_code == 404


def test_list_pages_newest_first(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    ids = [client.post("/v1/jobs", headers=auth, files=[("frames", (f"{i}.dng", _frame(synth_dir)))]).json()["id"]
           for i in range(5)]
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", headers=auth, params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]
    assert client.get("/v1/jobs", headers=auth, params={"status": "done"}).json()["jobs"] == []
    assert client.get("/v1/jobs", headers=auth, params={"status": "bogus"}).status_code == 422
    assert client.get("/v1/jobs", headers=auth, params={"cursor": "!!"}).status_code == 422


def test_cancel(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    job = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))]).json()
    r = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert r.status_code == 409 and r.json()["type"] == "conflict"


def test_remove_files_of_an_ended_job(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    """DELETE .../files: refused while the job is active, then the uploads go, the record stays (with when),
    an output answers 410, a second call changes nothing, another station sees 404."""
    job = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))]).json()
    r = client.delete(f"/v1/jobs/{job['id']}/files", headers=auth)
    assert r.status_code == 409 and "cancel it" in r.json()["detail"]
    assert any(job["id"] in str(p) for p in _storage_files())
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth).status_code == 200
    with session_scope() as session:  # as if it had rendered: one output row
        from services.db.models import Job, Output
        session.add(Output(job_id=job["id"], name="a.tif", recipe="tiff16", storage_key=f"jobs/{job['id']}/out/a.tif",
                           sha256="0" * 64, bytes=4, media_type="image/tiff"))
        assert session.get(Job, job["id"]) is not None
    assert client.delete(f"/v1/jobs/{job['id']}/files", headers=_token("station-b")).status_code == 404
    r = client.delete(f"/v1/jobs/{job['id']}/files", headers=auth)
    assert r.status_code == 200, r.text
    removed = r.json()["files_removed_at"]
    assert removed and r.json()["status"] == "cancelled" and r.json()["preview_url"] is None
    assert not any(job["id"] in str(p) for p in _storage_files())
    r = client.get(f"/v1/jobs/{job['id']}/outputs/a.tif", headers=auth)
    assert r.status_code == 410 and r.json()["type"] == "gone"
    assert client.get(f"/v1/jobs/{job['id']}/preview", headers=auth).status_code == 410
    again = client.delete(f"/v1/jobs/{job['id']}/files", headers=auth)
    assert again.status_code == 200 and again.json()["files_removed_at"] == removed


def _png_bytes() -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.zeros((8, 8, 3), np.uint8), photometric="rgb")
    return buf.getvalue()


BAD_UPLOADS = {
    "text file": (lambda d: [("frames", ("notes.dng", b"this is not a raw file\n" * 100))], {}, 422,
                  "not_a_raw_file"),
    "plain rgb tiff": (lambda d: [("frames", ("image.tif", _png_bytes()))], {}, 422, "not_a_raw_file"),
    "truncated dng": (lambda d: [("frames", ("cut.dng", d[: len(d) // 2]))], {}, 422, "not_a_raw_file"),
    "wrong checksum": (lambda d: [("frames", ("a.dng", d))], {"sha256": "0" * 64}, 422, "checksum_mismatch"),
    "unknown camera": (lambda d: [("frames", ("a.dng", d))], {"camera": "IQ9_Z"}, 422, "unknown_camera"),
    "unknown recipe": (lambda d: [("frames", ("a.dng", d))], {"recipe": "jpeg8"}, 422, "invalid_input"),
    "one unknown of two recipes": (lambda d: [("frames", ("a.dng", d))], {"recipe": ["tiff16", "jpeg8"]}, 422,
                                   "invalid_input"),
    "nine recipes": (lambda d: [("frames", ("a.dng", d))], {"recipe": ",".join(["tiff16"] * 1 + [
        "tiff8", "jpeg-proof", "png16", "tiff16-adobergb", "tiff16-prophoto", "tiff16-linear", "jpeg",
        "tiff16-uncompressed"])}, 422, "invalid_input"),
    "naming with a separator": (lambda d: [("frames", ("a.dng", d))], {"naming": "{stem}/x"}, 422, "invalid_naming"),
    "naming with ..": (lambda d: [("frames", ("a.dng", d))], {"naming": "..{stem}"}, 422, "invalid_naming"),
    "naming with an unknown token": (lambda d: [("frames", ("a.dng", d))], {"naming": "{user}"}, 422,
                                     "invalid_naming"),
    "bad priority": (lambda d: [("frames", ("a.dng", d))], {"priority": "urgent"}, 422, "invalid_input"),
    "stack for single-frame camera": (lambda d: [("frames", ("a.dng", d)), ("frames", ("b.dng", d))],
                                      {"camera": "IQ3_S"}, 422, "invalid_input"),
    "no frames": (lambda d: [("other", ("a.dng", d))], {}, 422, "invalid_input"),
    "misspelt field": (lambda d: [("frames", ("a.dng", d))], {"recipes": "jpeg-proof"}, 422, "invalid_input"),
    "one file twice in a stack": (lambda d: [("frames", ("a.dng", d)), ("frames", ("b.dng", d))], {}, 422,
                                  "invalid_input"),
}


@pytest.mark.parametrize("case", list(BAD_UPLOADS))
def test_bad_uploads_are_refused_cleanly(client: TestClient, auth: dict[str, str], synth_dir: Path,
                                         case: str) -> None:
    files, data, status, type_ = BAD_UPLOADS[case]
    r = client.post("/v1/jobs", headers=auth, files=files(_frame(synth_dir)), data=data)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == type_ and body["detail"]
    assert _storage_files() == []  # nothing half-written is left
    assert _job_count(client, auth) == 0
    assert client.get("/healthz").status_code == 200  # and the service keeps serving


def test_oversized_upload_is_413(client: TestClient, auth: dict[str, str], synth_dir: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_settings(), "max_upload_mb", 1)
    data = _frame(synth_dir)
    assert len(data) > 1 << 20
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("big.dng", data))])
    assert r.status_code == 413 and r.json()["type"] == "upload_too_large"
    assert _storage_files() == []
    assert _job_count(client, auth) == 0


def test_not_multipart_is_422(client: TestClient, auth: dict[str, str]) -> None:
    r = client.post("/v1/jobs", headers={**auth, "Content-Type": "application/json"}, content=b"{}")
    assert r.status_code == 422 and r.json()["type"] == "invalid_input"


def test_unknown_job_and_output_are_404(client: TestClient, auth: dict[str, str]) -> None:
    assert client.get("/v1/jobs/doesnotexist", headers=auth).json()["type"] == "not_found"
    assert client.get("/v1/jobs/doesnotexist/outputs/x.tif", headers=auth).status_code == 404


def test_recipes_are_listed(client: TestClient, auth: dict[str, str]) -> None:
    assert client.get("/v1/recipes").status_code == 401
    recipes = {r["name"]: r for r in client.get("/v1/recipes", headers=auth).json()["recipes"]}
    assert {"tiff16", "tiff16-uncompressed", "tiff16-adobergb", "tiff8", "jpeg-proof", "png16"} <= set(recipes)
    assert {
        k: recipes["tiff16"][k] for k in ("format", "bits", "space", "compression", "long_edge", "naming")} == {
        "format": "tiff", "bits": 16, "space": "srgb", "compression": "deflate", "long_edge": None,
        "naming": "{stem}"}
    assert recipes["jpeg-proof"]["long_edge"] == 1600 and recipes["jpeg-proof"]["naming"] == "{stem}_{recipe}"


def test_studio_recipes_file_is_listed_and_usable(client: TestClient, auth: dict[str, str], synth_dir: Path,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "recipes.toml"
    path.write_text('[recipes.web]\nbase = "jpeg-proof"\nlong_edge = 1024\n')
    monkeypatch.setattr(get_settings(), "recipes_file", path)
    names = [r["name"] for r in client.get("/v1/recipes", headers=auth).json()["recipes"]]
    assert "web" in names
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))], data={"recipe": "web"})
    assert r.status_code == 202 and r.json()["recipes"] == ["web"]
    path.write_text('[recipes.web]\nformat = "gif"\n')
    bad = client.get("/v1/recipes", headers=auth)
    assert bad.status_code == 422 and bad.json()["type"] == "invalid_recipe" and str(path) in bad.json()["detail"]
    # while the file is broken, shots still go in with the recipes as last read (a night's queue does not fail)
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("b.dng", _frame(synth_dir)))], data={"recipe": "web"})
    assert r.status_code == 202 and r.json()["recipes"] == ["web"]
    # Found from outside: the coordinator resolved a queued job's recipe names again at ingest, in its own reading
    # of the file (an older one, or none after a restart with the file broken): the night's batch failed with
    # "unknown recipe". A job renders its recipes as they were when it was accepted.
    path.write_text('[recipes.print]\nbase = "tiff16"\n')  # valid, and 'web' is gone
    assert "web" not in [r["name"] for r in client.get("/v1/recipes", headers=auth).json()["recipes"]]
    from services.db.models import Job, job_recipes
    from services.export.recipes import recipes_of_job

    with session_scope() as session:
        job = session.get(Job, r.json()["id"])
        [web] = recipes_of_job(job.params, job_recipes(job))
    assert web.name == "web" and web.long_edge == 1024 and web.format == "jpeg"


def test_the_recipe_field_may_repeat(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))],
                    data={"recipe": ["jpeg-proof", "tiff16", "jpeg-proof"], "naming": "{station}_{seq}_{recipe}"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["recipe"] == "jpeg-proof" and job["recipes"] == ["jpeg-proof", "tiff16"] and job["outputs"] == []


def test_a_recipe_named_twice_in_two_cases_is_one_recipe(client: TestClient, auth: dict[str, str],
                                                         synth_dir: Path) -> None:
    """Found from outside: ``recipe=tiff16,TIFF16,jpeg`` recorded tiff16 twice (the duplicates were dropped before
    the case was resolved): two TIFFs from one recipe, ``single.tif`` and ``single_2.tif``, and the outputs out of
    recipe order."""
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", _frame(synth_dir)))],
                    data={"recipe": ["tiff16,TIFF16", "JPEG", "Tiff16"]})
    assert r.status_code == 202, r.text
    assert r.json()["recipes"] == ["tiff16", "jpeg"]
    eight = ["tiff16", "tiff8", "jpeg", "png16", "jpeg-proof", "tiff16-fast", "tiff16-zstd", "tiff16-linear"]
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("b.dng", _frame(synth_dir)))],
                    data={"recipe": [*eight, "TIFF8"]})  # nine names, eight recipes
    assert r.status_code == 202 and r.json()["recipes"] == eight, r.text


@pytest.mark.parametrize("case", list(REFUSED))
def test_sensor_layouts_strata_cannot_render_are_refused_at_upload(client: TestClient, auth: dict[str, str],
                                                                   case: str) -> None:
    write, phrase = REFUSED[case]
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("odd.dng", write()))])
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["type"] == "unsupported_sensor"
    assert body["detail"].startswith("odd.dng: ") and phrase in body["detail"] and RENDERED in body["detail"]
    assert _storage_files() == [] and _job_count(client, auth) == 0


@pytest.mark.parametrize(("second", "phrase"), [
    ((48, 70, "RGGB"), "b.dng: frame 1 is 70 x 48 pixels but frame 0 (a.dng) is 72 x 48: a stack's frames must "
                       "have one size"),
    ((48, 72, "GBRG"), "b.dng: frame 1 has the CFA pattern GBRG but frame 0 (a.dng) has RGGB"),
])
def test_a_stack_whose_frames_differ_is_refused_at_upload(client: TestClient, auth: dict[str, str],
                                                          second: tuple[int, int, str], phrase: str) -> None:
    frames = [("frames", ("a.dng", bayer_dng())), ("frames", ("b.dng", bayer_dng(*second)))]
    r = client.post("/v1/jobs", headers=auth, files=frames, data={"camera": "IQ2_XS"})
    assert r.status_code == 422 and r.json()["type"] == "frames_mismatch", r.text
    assert phrase in r.json()["detail"]
    assert _storage_files() == [] and _job_count(client, auth) == 0
    ok = client.post("/v1/jobs", headers=auth, data={"camera": "IQ2_XS"},
                     files=[("frames", ("a.dng", bayer_dng())), ("frames", ("b.dng", bayer_dng(seed=4)))])
    assert ok.status_code == 202, ok.text


def test_raw_data_compressed_as_libraw_does_not_read_is_refused_at_upload(client: TestClient,
                                                                               auth: dict[str, str]) -> None:
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("z.dng", bayer_dng(compression="zlib")))])
    assert r.status_code == 422 and r.json()["type"] == "unsupported_sensor", r.text
    assert r.json()["detail"].startswith("z.dng: DNG raw data compressed with adobe deflate (8) is not supported")
    assert _storage_files() == [] and _job_count(client, auth) == 0


def test_lossless_jpeg_tiles_wider_than_the_image_are_refused_at_upload(client: TestClient,
                                                                       auth: dict[str, str]) -> None:
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("t.dng", lossless_jpeg_dng(48, 72, 256)))])
    assert r.status_code == 422 and r.json()["type"] == "unsupported_sensor", r.text
    assert r.json()["detail"].startswith("t.dng: lossless JPEG raw data in tiles wider than the image")
    assert _storage_files() == [] and _job_count(client, auth) == 0


def test_linear_dngs_are_single_frames_only(client: TestClient, auth: dict[str, str]) -> None:
    data = linear_dng()
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("a.dng", data)), ("frames", ("b.dng", data))])
    assert r.status_code == 422 and r.json()["type"] == "unsupported_sensor", r.text
    assert "stack of linear DNGs" in r.json()["detail"]


def test_the_job_names_the_source_camera(client: TestClient, auth: dict[str, str], synth_dir: Path) -> None:
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("lin.dng", linear_dng()))])
    assert r.status_code == 202, r.text
    assert r.json()["camera"] == "IQ3_S"  # the render profile: one frame in strips
    assert r.json()["source_camera"] == {"make": "Acme", "model": "Converter", "layout": "linear"}
    r = client.post("/v1/jobs", headers=auth, files=[("frames", ("f.dng", _frame(synth_dir)))])
    source = client.get(f"/v1/jobs/{r.json()['id']}", headers=auth).json()["source_camera"]
    assert source["layout"] == "bayer" and source["make"] == "Phase One"


def test_openapi_head_routes_document_the_get_media_types(client: TestClient) -> None:
    """A HEAD answers the GET's headers, Content-Type included: its 200 is documented with the GET's media types
    (found from outside: HEAD preview and output were documented as application/json while they answer
    image/jpeg and image/tiff|jpeg|png), and an output's HEAD documents the S3 redirect (307) as its GET does."""
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/jobs/{job_id}", "/v1/jobs/{job_id}/preview", "/v1/jobs/{job_id}/outputs/{name}"):
        get, head = paths[path]["get"]["responses"], paths[path]["head"]["responses"]
        assert set(head["200"]["content"]) == set(get["200"]["content"]), path
        assert {"404", "410"} <= set(head), path
    assert "307" in paths["/v1/jobs/{job_id}/outputs/{name}"]["head"]["responses"]
