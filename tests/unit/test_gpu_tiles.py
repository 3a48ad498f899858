"""TIFF tiles compressed beside the strips (services.pipeline.tiles) and written by the TIFF writer: the
container's layout, the Adler-32 the GPU path computes, and TIFFs mixing stored tiles with tiles the writer
compresses (strip boundaries off the tile grid). The nvCOMP path itself needs a GPU (scripts/gpu/check_tiles.py)."""

from __future__ import annotations

import io
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import tifffile
import torch

from services.export.tiff import write_tiff
from services.pipeline import tiles
from services.storage.local import LocalStorage


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 40000, w, dtype=np.float64)[None, :, None] + np.linspace(0, 9000, h)[:, None, None]
    return (base + rng.normal(0, 300, (h, w, 3))).clip(0, 65535).astype(np.uint16)


@pytest.mark.parametrize(("y0", "y1", "height", "expected"), [
    (0, 64, 200, range(0, 1)), (0, 63, 200, range(0, 0)), (10, 140, 200, range(1, 2)),
    (128, 200, 200, range(2, 4)), (0, 200, 200, range(0, 4)), (130, 190, 200, range(3, 3)),
])
def test_a_strip_holds_the_tile_rows_wholly_inside_it_and_the_images_last(y0, y1, height, expected) -> None:
    assert tiles.tile_rows_in(y0, y1, height) == expected


def test_adler32_matches_zlib() -> None:
    data = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (5, 49152), dtype=np.uint8))
    got = tiles._adler32(data).numpy()
    assert [int(v) for v in got] == [zlib.adler32(bytes(row.numpy())) for row in data]


def test_a_container_inflates_to_the_predicted_tiles() -> None:
    img = _image(150, 300)
    blob, index = tiles.cpu_tile_streams(img[20:150], 20, 150)
    assert list(index[:5]) == [tiles.TILE_H, tiles.TILE_W, 1, 2, 3]
    assert len(index) == tiles.HEADER + 2 * 3 + 1 and index[-1] == blob.size
    tiles.check_streams(blob, index, img[20:150], 20, sample=6)


@pytest.mark.parametrize("cuts", [[0, 200], [0, 64, 200], [0, 90, 130, 200]])
def test_a_tiff_of_stored_and_writer_compressed_tiles_reads_back_exact(tmp_path, cuts) -> None:
    img = _image(200, 300, seed=3)
    bands = [(a, img[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    pretiled = [tiles.cpu_tile_streams(rows, a, img.shape[0]) for a, rows in bands]
    storage = LocalStorage(tmp_path)
    write_tiff(storage, "a.tif", bands, compression="deflate", pretiled=[p for p in pretiled if p[1][3] > 0])
    with storage.open("a.tif") as f, tifffile.TiffFile(io.BytesIO(f.read())) as tif:
        page = tif.pages[0]
        assert (page.tilelength, page.tilewidth) == (tiles.TILE_H, tiles.TILE_W)
        assert page.compression == 8 and page.predictor == 2
        np.testing.assert_array_equal(page.asarray(), img)


def test_without_stored_tiles_the_writer_keeps_its_own_tiles(tmp_path) -> None:
    img = _image(100, 100, seed=4)
    storage = LocalStorage(tmp_path)
    write_tiff(storage, "b.tif", [(0, img)], compression="deflate")
    with storage.open("b.tif") as f, tifffile.TiffFile(io.BytesIO(f.read())) as tif:
        assert tif.pages[0].tilelength == 256
        np.testing.assert_array_equal(tif.pages[0].asarray(), img)


def test_tiles_are_asked_for_only_for_full_size_16_bit_deflate_tiffs() -> None:
    from services.export.recipes import resolve_recipes
    from services.jobs.plan import tile_plan

    recipes = resolve_recipes(["tiff16", "jpeg-proof"])
    assert tile_plan(recipes, True) == (recipes[0].colour_space,)
    assert tile_plan(recipes, False) == ()
    assert tile_plan(resolve_recipes(["jpeg-proof"]), True) == ()


@pytest.mark.parametrize("cuts", [[0, 301], [0, 90, 200, 301]])
def test_a_proof_from_bins_made_beside_the_strips_equals_the_one_the_writer_bins_itself(cuts) -> None:
    from services.export.derive import box_factor, fit_long_edge, resize_linear
    from services.pipeline.binning import bin_rows_in, binned

    img = _image(301, 407, seed=5)
    h, w = fit_long_edge(301, 407, 60)
    k = box_factor(301, 407, h, w)
    assert k == 3
    bands = [(a, img[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    made = [(bin_rows_in(a, a + rows.shape[0], k).start, binned(rows, a, k, "srgb")) for a, rows in bands]
    ref = resize_linear(bands, 60, "srgb")
    np.testing.assert_array_equal(resize_linear(bands, 60, "srgb", prebinned={k: made}).numpy(), ref.numpy())
    np.testing.assert_array_equal(resize_linear(bands, 60, "srgb", prebinned={k: made[:1]}).numpy(), ref.numpy())


def test_bins_are_planned_for_resized_outputs_only() -> None:
    from services.export.recipes import resolve_recipes
    from services.jobs.plan import bin_plan

    recipes = resolve_recipes(["tiff16", "jpeg-proof"])
    assert bin_plan(recipes, 7728, 10304, True) == ((recipes[1].colour_space, 3),)
    assert bin_plan(recipes, 7728, 10304, False) == () and bin_plan(recipes[:1], 7728, 10304, True) == ()


def test_a_space_is_lean_when_every_recipe_of_it_is_made_from_gpu_tiles_or_bins() -> None:
    from services.export.recipes import resolve_recipes
    from services.jobs.plan import bin_plan, lean_plan, tile_plan

    def lean(names: list[str], tiles: bool = True, bins: bool = True) -> tuple[str, ...]:
        recipes = resolve_recipes(names)
        return lean_plan(recipes, tile_plan(recipes, tiles), bin_plan(recipes, 7728, 10304, bins), 7728, 10304)

    assert lean(["tiff16", "jpeg-proof"]) == ("srgb",)
    assert lean(["tiff16", "jpeg-proof"], tiles=False) == ()  # the TIFF is compressed from the rows
    assert lean(["jpeg-proof"], tiles=False) == ("srgb",)  # bins only: lean on any worker
    assert lean(["tiff16", "jpeg-proof"], bins=False) == ()
    assert lean(["tiff16", "png16"]) == ()  # a full-size PNG reads every row


SHOT_CROP = (256, 384)  # rows, columns: 4 x 3 tiles, several bins and strips; an eighth of the frame's pixels


def _stored_shot(tmp_path, synth_dir):  # type: ignore[no-untyped-def]
    """The synthetic IQ3_S frame decoded, its top-left ``SHOT_CROP`` (even: the CFA phase kept) stored in a
    LocalStorage at ``raw.npy``: (storage, mosaic, render params). The tests' point is the strip, tile and bin
    bookkeeping, not the frame's size: the crop renders in an eighth of the time."""
    from services.pipeline.shot import shot_render_params
    from services.raw.decode import decode_raw

    storage = LocalStorage(tmp_path)
    meta = decode_raw(synth_dir / "iq3s" / "frame_00.dng", tmp_path / "raw.npy")
    mosaic = np.ascontiguousarray(np.load(tmp_path / "raw.npy")[: SHOT_CROP[0], : SHOT_CROP[1]])
    with storage.array_writer("raw.npy", mosaic.shape, mosaic.dtype) as out:
        out[:] = mosaic
    return storage, mosaic, shot_render_params(meta, mosaic, "srgb")


def test_a_worker_bins_its_strips_and_the_proof_written_from_them_is_the_same_file(tmp_path, synth_dir) -> None:
    """compute_shard (CPU worker) with PreEncode bins: the bins land beside each strip; the proof the writer makes
    from strips + bins is byte for byte the one it makes from the strips alone."""
    from services.export.derive import box_factor, fit_long_edge
    from services.export.metadata import OutputMetadata
    from services.export.output import write_recipe
    from services.export.recipes import Recipe
    from services.pipeline.binning import bin_rows_in
    from services.pipeline.shards import PreEncode, StripShard, compute_shard
    from services.raw.meta import CaptureInfo
    from services.storage.keys import bin_key

    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    height, width = mosaic.shape
    recipe = Recipe(name="small-proof", format="jpeg", bits=8, long_edge=max(height, width) // 5, quality=90)
    k = box_factor(height, width, *fit_long_edge(height, width, recipe.long_edge))
    assert k >= 2
    cut = height // 3 // 2 * 2  # an even row (strips keep the CFA phase)
    bands = []
    for i, (y0, y1) in enumerate([(0, cut), (cut, height)]):
        key = f"p0/strip_{i:03d}.npy"
        shard = StripShard(job_id="j", out=key, params=params, y0=y0, y1=y1, source="raw.npy",
                           ahead=PreEncode(bins=((key, k, "srgb"),)))
        compute_shard(storage, shard, "cpu")
        bins = storage.load_array(bin_key(key, k))
        assert bins.shape == (len(bin_rows_in(y0, y1, k)), width // k, 3)
        bands.append((y0, storage.load_array(key), (bin_rows_in(y0, y1, k).start, bins)))
    meta_out = OutputMetadata(CaptureInfo(make="Phase One", model="IQ3"), "frame_00.dng")
    strips = [(y0, rows) for y0, rows, _ in bands]
    with_bins = write_recipe(storage, "a.jpg", strips, recipe, meta_out, prebinned={k: [b for *_, b in bands]})
    without = write_recipe(storage, "b.jpg", strips, recipe, meta_out)
    assert with_bins == without
    # The final preview's block sums (the sRGB result of a shard asked for writer work) land beside each strip;
    # a preview from them is the preview from the strips, whichever strips hold whole blocks.
    from services.pipeline.preview import preview_factor, strips_preview
    from services.storage.keys import preview_sums_key

    f = preview_factor(height, width)
    sums = [(bin_rows_in(y0, y0 + rows.shape[0], f).start,
             storage.load_array(preview_sums_key(f"p0/strip_{i:03d}.npy", f))) for i, (y0, rows) in enumerate(strips)]
    reference = strips_preview(strips)
    covered = sum(s.shape[0] for _, s in sums) == height // f
    assert covered == (cut % f == 0)  # a strip boundary inside a block: the preview sums those rows itself
    assert np.array_equal(strips_preview(strips, premade=sums), reference)


@pytest.mark.parametrize(("fmt", "bits", "amount"), [("jpeg", 8, 0.5), ("tiff", 16, 0.0)])
def test_a_worker_whose_strip_holds_the_image_finishes_the_proof_and_the_file_is_the_same(
        tmp_path, synth_dir, fmt, bits, amount) -> None:
    """A whole-image strip asked for ProofWork: the worker stores the finished codes instead of the bins; the file
    written from them is byte for byte the one the writer derives from the strip alone (the same function, the
    same bins, the same layout)."""
    from services.export.derive import box_factor, fit_long_edge, proof_spec
    from services.export.metadata import OutputMetadata
    from services.export.output import write_recipe
    from services.export.recipes import Recipe
    from services.pipeline.shards import PreEncode, ProofWork, StripShard, compute_shard
    from services.raw.meta import CaptureInfo
    from services.storage.keys import bin_key, proof_key

    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    height, width = mosaic.shape
    recipe = Recipe(name="proof", format=fmt, bits=bits, long_edge=max(height, width) // 5, sharpen=amount)
    size = fit_long_edge(height, width, recipe.long_edge)
    k = box_factor(height, width, *size)
    key = "p0/strip_000.npy"
    spec = proof_spec(recipe)
    work = ProofWork(key=key, k=k, transfer="srgb", size=size, sharpen=amount, bits=bits,
                     out=proof_key(key, *spec[1:]))
    shard = StripShard(job_id="j", out=key, params=params, y0=0, y1=height, source="raw.npy",
                       ahead=PreEncode(bins=((key, k, "srgb"),), proofs=(work,)))
    compute_shard(storage, shard, "cpu")
    assert not storage.exists(bin_key(key, k))  # served by the finished output
    codes = storage.load_array(work.out)
    assert codes.shape == (*size, 3) and codes.dtype == (np.uint8 if bits == 8 else np.uint16)
    strips = [(0, storage.load_array(key))]
    meta_out = OutputMetadata(CaptureInfo(make="Phase One", model="IQ3"), "frame_00.dng")
    finished = write_recipe(storage, f"a.{fmt}", strips, recipe, meta_out, finished=codes)
    assert finished == write_recipe(storage, f"b.{fmt}", strips, recipe, meta_out)
    # A finished output of another size (the recipe changed after the job was planned) is not used.
    other = recipe.model_copy(update={"long_edge": recipe.long_edge // 2})
    assert write_recipe(storage, "c.jpg", strips, other, meta_out, finished=codes) == write_recipe(
        storage, "d.jpg", strips, other, meta_out)


def test_proofs_are_planned_for_outputs_made_from_gpu_bins_and_asked_of_whole_image_strips_only() -> None:
    from services.export.recipes import resolve_recipes
    from services.jobs.plan import bin_plan, proof_plan, proof_work

    recipes = resolve_recipes(["tiff16", "jpeg-proof"])
    bins = bin_plan(recipes, 7728, 10304, True)
    specs = proof_plan(recipes, bins, 7728, 10304, True)
    proof = recipes[1]
    assert specs == ((proof.colour_space, proof.long_edge, proof.bits, float(proof.sharpen)),)
    assert proof_plan(recipes, bins, 7728, 10304, False) == () and proof_plan(recipes, (), 7728, 10304, True) == ()
    plan = SimpleNamespace(size=(7728, 10304), proof_specs=specs)
    (work,) = proof_work(plan, {proof.colour_space: "jobs/j/p0/strip_000.npy"})  # type: ignore[arg-type]
    assert (work.k, work.size, work.bits) == (3, (1200, 1600), proof.bits)
    assert work.out == f"jobs/j/p0/strip_000.proof{proof.long_edge}-{proof.bits}-{proof.sharpen:g}.npy"


def test_raw_streams_at_a_fixed_stride_are_framed_into_zlib_streams_back_to_back() -> None:
    """The GPU path's framing (tiles.zlib_wrap), on the CPU: raw deflate streams held at a fixed stride, as nvCOMP
    leaves them, become zlib streams that inflate to each tile and carry its Adler-32."""
    rng = np.random.default_rng(4)
    data = [rng.integers(0, 40, 3000 + 500 * i, dtype=np.uint8).tobytes() for i in range(5)]
    raws = []
    for d in data:
        c = zlib.compressobj(1, zlib.DEFLATED, -15)
        raws.append(c.compress(d) + c.flush())
    stride = max(len(r) for r in raws) + 37
    payload = torch.zeros((len(raws), stride), dtype=torch.uint8)
    for i, r in enumerate(raws):
        payload[i, : len(r)] = torch.frombuffer(bytearray(r), dtype=torch.uint8)
    sizes = torch.tensor([len(r) for r in raws])
    checks = torch.tensor([zlib.adler32(d) for d in data])
    flat = tiles.zlib_wrap(payload, sizes, checks).numpy().tobytes()
    at = 0
    for d, r in zip(data, raws, strict=True):
        stream = flat[at : at + len(r) + 6]
        assert zlib.decompress(stream) == d  # zlib checks the header and the Adler-32
        at += len(r) + 6
    assert at == len(flat)


def test_a_worker_compresses_tiles_from_the_rows_on_the_device_and_streams_them(tmp_path, synth_dir,
                                                                                 monkeypatch) -> None:
    """compute_shard with PreEncode tiles, nvCOMP stood in for by the CPU container (the one thing here that
    needs a GPU): the tiles are made from the rows handed over on the device (no re-upload of the downloaded
    ones), written as a stream beside the strip, and the TIFF made from strips + those tiles reads back exact."""
    from services.pipeline import shards
    from services.pipeline.shards import PreEncode, StripShard, compute_shard
    from services.storage.keys import tile_keys

    inputs: list[type] = []

    def fake_device_tiles(rows, y0, height, device, level=0):  # type: ignore[no-untyped-def]
        inputs.append(type(rows))
        host = rows.cpu().numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
        blob, index = tiles.cpu_tile_streams(host, y0, height)
        return torch.from_numpy(blob.copy()), index

    monkeypatch.setattr(shards.tiles, "gpu_available", lambda device: True)
    monkeypatch.setattr(shards.tiles, "device_tile_streams", fake_device_tiles)
    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    height = mosaic.shape[0]
    cut = (height // 3 + 37) // 2 * 2  # off the 64-row tile grid: the writer compresses the straddling tile row
    bands, pretiled = [], []
    for i, (y0, y1) in enumerate([(0, cut), (cut, height)]):
        key = f"p0/strip_{i:03d}.npy"
        compute_shard(storage, StripShard(job_id="j", out=key, params=params, y0=y0, y1=y1, source="raw.npy",
                                          ahead=PreEncode(tiles=(key,), level=0)), "cpu")
        blob_key, index_key = tile_keys(key)
        rows = storage.load_array(key)
        blob, index = storage.load_array(blob_key), storage.load_array(index_key)  # the stream's sample digest holds
        tiles.check_streams(blob, index, rows, y0, sample=12)
        bands.append((y0, rows))
        pretiled.append((blob, index))
    assert inputs == [torch.Tensor, torch.Tensor]  # from the device rows, never re-uploaded
    write_tiff(storage, "w.tif", bands, compression="deflate", pretiled=pretiled)
    with storage.open("w.tif") as f, tifffile.TiffFile(io.BytesIO(f.read())) as tif:
        assert (tif.pages[0].tilelength, tif.pages[0].tilewidth) == (tiles.TILE_H, tiles.TILE_W)
        np.testing.assert_array_equal(tif.pages[0].asarray(), np.concatenate([r for _, r in bands]))


@pytest.mark.parametrize("cuts", [[0, 200], [0, 90, 130, 200]])
def test_the_one_pass_tiff_is_the_file_tifffile_writes_and_its_hash_is_the_files(tmp_path, cuts) -> None:
    """The laid-out write (tifffile places the tiles, the file is written front to back and hashed beside the
    write) gives the very bytes tifffile writes from the same tiles, tags and ICC profile included."""
    import hashlib

    from services.export.icc import icc_profile
    from services.export.tiff import _deflated_tiles, _pretiled_items, _Stored

    img = _image(200, 300, seed=5)
    bands = [(a, img[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    pretiled = [p for p in (tiles.cpu_tile_streams(rows, a, img.shape[0]) for a, rows in bands) if p[1][3] > 0]
    storage = LocalStorage(tmp_path)
    extratags = [(33432, "s", 0, "(c) studio", True)]
    sha, size = write_tiff(storage, "c.tif", bands, compression="deflate", pretiled=pretiled, software="Strata t",
                           ppi=300.0, description="shot.dng", extratags=extratags)
    written = storage.open("c.tif").read()
    tile, items = _pretiled_items(bands, 200, 300, pretiled)
    direct = [bytes(memoryview(t.blob)[t.start : t.end]) if isinstance(t, _Stored) else t  # type: ignore[arg-type]
              for t in _deflated_tiles(items, 2, tile)]
    expected = io.BytesIO()
    tifffile.imwrite(expected, iter(direct), shape=img.shape, dtype=img.dtype, photometric="rgb", tile=tile,
                     compression="adobe_deflate", predictor=2, iccprofile=icc_profile("srgb"), software="Strata t",
                     description="shot.dng", resolution=(300.0, 300.0), resolutionunit="INCH", extratags=extratags,
                     metadata=None)
    assert written == expected.getvalue()
    assert (sha, size) == (hashlib.sha256(written).hexdigest(), len(written))



def test_a_tiff_whose_stored_streams_cover_little_is_streamed_and_still_exact(tmp_path) -> None:
    """Stored streams for one strip of a long image (the other strip's tiles failed on its GPU): the writer
    compresses the rest a few tiles at a time and tifffile writes the file (no one-pass layout holding them all)."""
    import hashlib

    img = _image(300, 200, seed=8)
    bands = [(0, img[:64]), (64, img[64:])]
    pretiled = [tiles.cpu_tile_streams(img[:64], 0, 300)]
    storage = LocalStorage(tmp_path)
    sha, size = write_tiff(storage, "e.tif", bands, compression="deflate", pretiled=pretiled)
    data = storage.open("e.tif").read()
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        assert tif.pages[0].tilelength == tiles.TILE_H
        np.testing.assert_array_equal(tif.pages[0].asarray(), img)


def test_kept_rows_of_a_lean_strip_are_the_straddling_units_rows() -> None:
    from services.pipeline.shards import kept_rows
    from services.pipeline.tiles import TILE_H

    assert kept_rows(0, 1000, 1000, [3, 8], tiled=True) == []  # one strip holds every unit whole: no rows
    # a middle strip: rows before its first whole tile row and bin, and after its last
    head = -(-100 // TILE_H) * TILE_H - 100
    tail = 900 // TILE_H * TILE_H - 100
    assert kept_rows(100, 900, 2000, [3], tiled=True) == [(0, head), (tail, 800)]
    assert kept_rows(100, 902, 2000, [3], tiled=False) == [(0, 2), (800, 802)]  # bins of 3 rows only
    assert kept_rows(0, 8, 2000, [16], tiled=False) == [(0, 8)]  # no whole bin: every row


def test_a_lean_strip_keeps_only_the_straddling_rows_and_its_outputs_are_the_same(tmp_path, synth_dir) -> None:  # type: ignore[no-untyped-def]
    """A proof-only job's strips (bins and preview sums made beside them, ``PreEncode.lean``): the rows no unit
    straddling the strips needs are not downloaded, and the proof and final preview made from the lean strips
    are byte for byte those made from full ones."""
    from services.export.derive import box_factor, fit_long_edge
    from services.export.metadata import OutputMetadata
    from services.export.output import write_recipe
    from services.export.recipes import Recipe
    from services.pipeline.binning import bin_rows_in
    from services.pipeline.preview import preview_factor, strips_preview
    from services.pipeline.shards import PreEncode, StripShard, compute_shard, kept_rows
    from services.raw.meta import CaptureInfo
    from services.storage.keys import bin_key, preview_sums_key

    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    height, width = mosaic.shape
    recipe = Recipe(name="small-proof", format="jpeg", bits=8, long_edge=max(height, width) // 10, quality=90)
    k = box_factor(height, width, *fit_long_edge(height, width, recipe.long_edge))
    f = preview_factor(height, width)
    cut = height // 3 // (2 * k) * (2 * k) + 2  # an even row inside a bin (k > 2 rows)
    assert k > 2 and cut % k
    meta_out = OutputMetadata(CaptureInfo(make="Phase One", model="IQ3"), "frame_00.dng")
    results = {}
    for lean in (False, True):
        strips, bins, sums = [], {k: []}, []
        for i, (y0, y1) in enumerate([(0, cut), (cut, height)]):
            key = f"{'lean' if lean else 'full'}/strip_{i:03d}.npy"
            shard = StripShard(job_id="j", out=key, params=params, y0=y0, y1=y1, source="raw.npy",
                               ahead=PreEncode(bins=((key, k, "srgb"),), lean=(key,) if lean else ()))
            compute_shard(storage, shard, "cpu")
            rows = storage.load_array(key)
            strips.append((y0, rows))
            bins[k].append((bin_rows_in(y0, y1, k).start, storage.load_array(bin_key(key, k))))
            sums.append((bin_rows_in(y0, y1, f).start, storage.load_array(preview_sums_key(key, f))))
            if lean:  # rows outside the kept ranges were never written (the file's zero pages)
                kept = np.zeros(y1 - y0, dtype=bool)
                for a, b in kept_rows(y0, y1, height, [k, f], tiled=False):
                    kept[a:b] = True
                assert 0 < kept.sum() < y1 - y0, (height, width, k, f, cut, y0, y1)
                assert not rows[~kept].any()
                assert np.array_equal(rows[kept], results[False][0][i][1][kept])
        proof = write_recipe(storage, f"{lean}.jpg", strips, recipe, meta_out, prebinned=bins)
        results[lean] = (strips, proof, strips_preview(strips, premade=sums))
    assert results[True][1] == results[False][1]  # the proof's (sha256, bytes)
    assert np.array_equal(results[True][2], results[False][2])  # the final preview


def test_a_recipe_that_needs_the_full_render_of_a_lean_space_starts_the_job_over() -> None:
    """A studio's recipe changed between the plan and the finalize to one that reads every row (a full-size PNG)
    of a space the workers rendered lean: the job starts over (IntermediateLost), re-planned for it."""
    from types import SimpleNamespace

    from services.errors import IntermediateLost
    from services.export.derive import proof_spec
    from services.export.recipes import resolve_recipes
    from services.jobs.finalize import _check_lean, _Strips

    plan = SimpleNamespace(lean_spaces=("srgb",), tile_spaces=("srgb",), bin_specs=(("srgb", 3),), size=(7728, 10304))
    with_bins = _Strips(prebinned={"srgb": {3: []}})
    _check_lean("j", plan, resolve_recipes(["tiff16", "jpeg-proof"]), with_bins)  # type: ignore[arg-type]
    with pytest.raises(IntermediateLost, match="png16"):
        _check_lean("j", plan, resolve_recipes(["tiff16", "png16"]), with_bins)  # type: ignore[arg-type]
    # A worker that finished the proof stored no bins: the proof is served; a recipe changed to another proof
    # (other sharpening) has neither its finished pixels nor bins, and the job starts over.
    recipes = resolve_recipes(["tiff16", "jpeg-proof"])
    finished = _Strips(proofs={proof_spec(recipes[1]): np.zeros((1, 1, 3), np.uint8)})
    _check_lean("j", plan, recipes, finished)  # type: ignore[arg-type]
    changed = [recipes[0], recipes[1].model_copy(update={"sharpen": recipes[1].sharpen + 0.25})]
    with pytest.raises(IntermediateLost, match="jpeg-proof"):
        _check_lean("j", plan, changed, finished)  # type: ignore[arg-type]


def test_a_tiff_from_lean_strips_and_their_gpu_tiles_is_the_full_render(tmp_path, synth_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Lean strips with TIFF tiles (nvCOMP stood in for by the CPU container): each strip keeps only the rows of
    the tile row straddling the cut; the TIFF the writer makes from them and their tiles reads back as the full
    render (the straddling tile row compressed from the kept rows of both strips)."""
    from services.pipeline import shards
    from services.pipeline.shards import PreEncode, StripShard, compute_shard
    from services.storage.keys import tile_keys

    def fake_device_tiles(rows, y0, height, device, level=0):  # type: ignore[no-untyped-def]
        blob, index = tiles.cpu_tile_streams(rows.cpu().numpy(), y0, height)
        return torch.from_numpy(blob.copy()), index

    monkeypatch.setattr(shards.tiles, "gpu_available", lambda device: True)
    monkeypatch.setattr(shards.tiles, "device_tile_streams", fake_device_tiles)
    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    height = mosaic.shape[0]
    cut = (height // 3 + 37) // 2 * 2  # off the 64-row tile grid
    full, lean, pretiled = [], [], []
    for i, (y0, y1) in enumerate([(0, cut), (cut, height)]):
        for name, bands in (("full", full), ("lean", lean)):
            key = f"{name}/strip_{i:03d}.npy"
            compute_shard(storage, StripShard(job_id="j", out=key, params=params, y0=y0, y1=y1, source="raw.npy",
                                              ahead=PreEncode(tiles=(key,), level=0,
                                                              lean=(key,) if name == "lean" else ())), "cpu")
            bands.append((y0, storage.load_array(key)))
        blob_key, index_key = tile_keys(key)
        pretiled.append((storage.load_array(blob_key), storage.load_array(index_key)))
    whole = np.concatenate([r for _, r in full])
    assert not np.array_equal(np.concatenate([r for _, r in lean]), whole)  # rows were left out
    assert not lean[0][1][: cut // tiles.TILE_H * tiles.TILE_H].any()  # strip 0 kept only its last partial tile row
    write_tiff(storage, "lean.tif", lean, compression="deflate", pretiled=pretiled)
    with storage.open("lean.tif") as f, tifffile.TiffFile(io.BytesIO(f.read())) as tif:
        np.testing.assert_array_equal(tif.pages[0].asarray(), whole)


def test_a_strip_holds_a_device_slot_while_it_renders_and_stores_its_tiles_without_it(tmp_path, synth_dir,
                                                                                    monkeypatch) -> None:
    """services/pipeline/gate.py: with one device slot, the tiles are made from the rows on the device while the
    strip holds the slot, and written to storage after it gave the slot back (the next strip renders meanwhile)."""
    from services.pipeline import gate, shards
    from services.pipeline.shards import PreEncode, StripShard, compute_shard

    free_at: dict[str, int] = {}

    def fake_device_tiles(rows, y0, height, device, level=0):  # type: ignore[no-untyped-def]
        free_at["render"] = gate._gate.free  # type: ignore[union-attr]
        blob, index = tiles.cpu_tile_streams(rows.cpu().numpy(), y0, height)
        return torch.from_numpy(blob.copy()), index

    real_write = shards._write_tiles

    def write_tiles(*args):  # type: ignore[no-untyped-def]
        free_at["store"] = gate._gate.free  # type: ignore[union-attr]
        return real_write(*args)

    monkeypatch.setattr(shards.tiles, "gpu_available", lambda device: True)
    monkeypatch.setattr(shards.tiles, "device_tile_streams", fake_device_tiles)
    monkeypatch.setattr(shards, "_write_tiles", write_tiles)
    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    gate.configure(1)
    try:
        compute_shard(storage, StripShard(job_id="j", out="p0/strip_000.npy", params=params, y0=0,
                                          y1=mosaic.shape[0], source="raw.npy",
                                          ahead=PreEncode(tiles=("p0/strip_000.npy",), level=0)), "cpu")
    finally:
        gate.configure(None)
    assert free_at == {"render": 0, "store": 1}


def test_a_file_a_worker_wrote_is_moved_only_for_its_planned_recipe_and_a_changed_one_starts_over(tmp_path) -> None:
    """The finalize moves a worker's TIFF into the outputs for the one recipe whose spec is still the planned one;
    a finalize run again after the move finds it there. A recipe changed meanwhile (another resolution) is not
    served by it, and since its worker stored no tiles for a lean space, the job starts over."""
    from types import SimpleNamespace

    from services.errors import IntermediateLost
    from services.export.output import WorkerFile, file_spec
    from services.export.recipes import resolve_recipes
    from services.jobs.finalize import _check_lean, _moved, _Strips

    recipes = resolve_recipes(["tiff16", "jpeg-proof"])
    plan = SimpleNamespace(lean_spaces=("srgb",), tile_spaces=("srgb",), bin_specs=(("srgb", 3),),
                           size=(7728, 10304), file_specs=(file_spec(recipes[0], "shot.dng"),))
    storage = LocalStorage(tmp_path)
    with storage.writer("jobs/j/p0/strip_000.tif") as f:
        f.write(b"tiff")
    made = WorkerFile("jobs/j/p0/strip_000.tif", "ab" * 32, 4)
    found = _Strips(prebinned={"srgb": {3: []}}, files={"srgb": made})
    moved = _moved(plan, recipes, found, "shot.dng")  # type: ignore[arg-type]
    assert moved == {0: made}
    _check_lean("j", plan, recipes, found, moved)  # type: ignore[arg-type]
    for _ in range(2):  # the second: a finalize run again
        made.move_to(storage, "j", "jobs/j/out/shot.tif")
        assert storage.open("jobs/j/out/shot.tif").read() == b"tiff"
    assert not storage.exists(made.key)
    storage.delete_prefix("jobs/j/out")
    with pytest.raises(IntermediateLost):
        made.move_to(storage, "j", "jobs/j/out/shot.tif")
    changed = [recipes[0].model_copy(update={"ppi": 600.0}), recipes[1]]
    assert _moved(plan, changed, found, "shot.dng") == {}  # type: ignore[arg-type]
    assert _moved(plan, recipes, found, "other.dng") == {}  # type: ignore[arg-type]
    with pytest.raises(IntermediateLost, match="tiff16"):
        _check_lean("j", plan, changed, found, {})  # type: ignore[arg-type]
    _check_lean("j", plan, changed, _Strips(prebinned={"srgb": {3: []}}, pretiled={"srgb": []},  # type: ignore[arg-type]
                                            files={"srgb": made}), {})


def test_a_worker_writes_the_tiff_only_when_its_tiles_cover_the_image() -> None:
    """tiff_around lays a file out around one container holding every tile row; one holding some raises (the
    worker then stores its tiles for the writer)."""
    from services.export.tiff import TiffTags, tiff_around

    img = _image(200, 300, seed=3)
    _, index = tiles.cpu_tile_streams(img, 0, 200)
    head, tail = tiff_around(200, 300, index, TiffTags("srgb", "Strata t", 300.0, "shot.dng"))
    assert head[:4] in (b"II*\x00", b"MM\x00*") and len(head) > 1000
    _, part = tiles.cpu_tile_streams(img[:128], 0, 200)
    with pytest.raises(ValueError, match="tile rows"):
        tiff_around(200, 300, part, TiffTags())


def test_a_torn_record_of_a_workers_tiff_is_as_good_as_none(tmp_path) -> None:
    """The record beside a worker's TIFF is not synced: one a host crash left empty or half-written is ignored
    (the finalize then writes the file, or starts the job over), never a failed job."""
    from services.jobs.finalize import _Strips, _worker_file
    from services.storage.keys import worker_file_keys

    storage = LocalStorage(tmp_path)
    key = "jobs/j/p0/strip_000.npy"
    _, record = worker_file_keys(key)
    for body in (b"", b'{"sha256": "ab"', b'{"bytes": 4}', b"[1, 2]"):
        with storage.writer(record) as f:
            f.write(body)
        found = _Strips()
        _worker_file(storage, "j", key, "srgb", found)
        assert found.files == {}
    with storage.writer(record) as f:
        f.write(b'{"sha256": "ab", "bytes": 4}')
    _worker_file(storage, "j", key, "srgb", found)
    assert found.files["srgb"].bytes == 4


def test_a_worker_whose_tiff_cannot_be_laid_out_stores_the_tiles_instead(tmp_path, synth_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A whole-image strip asked to write its TIFF (WholeFile): written, with its record, and no tile streams
    stored; where the layout fails, the tiles are stored for the writer as before and no file is left."""
    import json
    from functools import partial

    from services.export.tiff import TiffTags, tiff_around
    from services.pipeline import shards
    from services.pipeline.shards import PreEncode, StripShard, WholeFile, compute_shard
    from services.storage.keys import tile_keys, worker_file_keys

    def fake_device_tiles(rows, y0, height, device, level=0):  # type: ignore[no-untyped-def]
        blob, index = tiles.cpu_tile_streams(rows.cpu().numpy(), y0, height)
        return torch.from_numpy(blob.copy()), index

    def broken(index):  # type: ignore[no-untyped-def]
        raise RuntimeError("tifffile could not lay it out")

    monkeypatch.setattr(shards.tiles, "gpu_available", lambda device: True)
    monkeypatch.setattr(shards.tiles, "device_tile_streams", fake_device_tiles)
    storage, mosaic, params = _stored_shot(tmp_path, synth_dir)
    height, width = mosaic.shape
    for name, around in (("ok", partial(tiff_around, height, width, tags=TiffTags())), ("broken", broken)):
        key = f"{name}/strip_000.npy"
        out, record = worker_file_keys(key)
        whole = WholeFile(key=key, out=out, record=record, around=around)
        compute_shard(storage, StripShard(job_id="j", out=key, params=params, y0=0, y1=height, source="raw.npy",
                                          ahead=PreEncode(tiles=(key,), level=0, files=(whole,))), "cpu")
        assert storage.exists(out) == storage.exists(record) == (name == "ok")
        assert storage.exists(tile_keys(key)[0]) == (name == "broken")
        if name == "ok":
            with storage.open(record) as f:
                assert json.loads(f.read())["bytes"] == storage.size(out)
            with storage.open(out) as f, tifffile.TiffFile(io.BytesIO(f.read())) as tif:
                np.testing.assert_array_equal(tif.pages[0].asarray(), storage.load_array(key))
