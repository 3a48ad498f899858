"""Recipes as data: built-ins, a studio's TOML file (validated with errors naming file and recipe), several
recipes per job, naming templates and their sanitising."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.errors import BadInput
from services.export.naming import BadNaming, NameTokens, render_name, sanitise, unique_names, validate_template
from services.export.output import output_names
from services.export.recipes import (
    BUILTIN_RECIPES,
    BadRecipe,
    Recipe,
    UnknownRecipe,
    catalogue,
    get_recipe,
    job_model_tier,
    job_spaces,
    load_recipes_file,
    resolve_recipes,
)

TOKENS = NameTokens(station="Studio 3", camera="IQ3 100MP", capture_date="2026-11-30", stem="frame_00", seq=7,
                    job="abc123")


def test_builtins_keep_every_old_name_and_deflate_is_the_default() -> None:
    for name in ("tiff16", "tiff16-uncompressed", "tiff16-adobergb", "tiff16-prophoto", "tiff16-linear",
                 "tiff8", "jpeg-proof", "png16"):
        assert name in BUILTIN_RECIPES
    default = get_recipe(None)
    assert (default.name, default.format, default.bits, default.space, default.compression) == (
        "tiff16", "tiff", 16, "srgb", "deflate")
    assert get_recipe("tiff16-uncompressed").compression == "none"
    proof = get_recipe("jpeg-proof")
    assert (proof.format, proof.bits, proof.long_edge, proof.extension, proof.media_type) == (
        "jpeg", 8, 1600, "jpg", "image/jpeg")
    assert proof.quality == 90 and proof.sharpen > 0
    assert default.template == "{stem}" and proof.template == "{stem}_{recipe}"
    public = default.to_public()
    assert {"name", "format", "bits", "space", "compression", "long_edge", "naming"} <= set(public)


def test_several_recipes_dedupe_keep_order_and_are_bounded() -> None:
    names = [r.name for r in resolve_recipes(["jpeg-proof", "tiff16", "jpeg-proof", " tiff16-adobergb "])]
    assert names == ["jpeg-proof", "tiff16", "tiff16-adobergb"]
    assert [r.name for r in resolve_recipes([])] == ["tiff16"]
    assert job_spaces(resolve_recipes(["tiff16", "jpeg-proof", "tiff16-prophoto", "png16"])) == ["srgb", "prophoto"]
    with pytest.raises(BadInput, match="at most 8"):
        resolve_recipes([f"r{i}" for i in range(9)])
    with pytest.raises(UnknownRecipe, match="unknown recipe 'jpeg8'"):
        resolve_recipes(["tiff16", "jpeg8"])
    assert [r.name for r in resolve_recipes(["TIFF16", "JPEG-Proof"])] == ["tiff16", "jpeg-proof"]  # any case


def test_studio_file_adds_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "recipes.toml"
    path.write_text('''
[recipes.web]
base = "jpeg-proof"
long_edge = 2048
quality = 80
naming = "{station}_{capture_date}_{seq}_{stem}"

[recipes.tiff16]
compression = "lzw"
description = "the studio's own default"

[recipes.print-adobe]
format = "tiff"
bits = 16
space = "adobergb"
ppi = 360
''')
    recipes = load_recipes_file(path)
    web = recipes["web"]
    assert (web.format, web.long_edge, web.quality, web.sharpen) == ("jpeg", 2048, 80,
                                                                      BUILTIN_RECIPES["jpeg-proof"].sharpen)
    assert recipes["tiff16"].compression == "lzw" and recipes["print-adobe"].ppi == 360
    assert "tiff16-prophoto" in recipes  # the built-ins stay
    assert render_name(web.template, TOKENS, "web", web.extension) == "Studio_3_2026-11-30_0007_frame_00.jpg"
    assert catalogue(path)["web"] == web


@pytest.mark.parametrize(("table", "reason"), [
    ('format = "gif"', "format"),
    ('format = "jpeg"\nbits = 16', "8-bit"),
    ('bits = 12', "16-bit"),
    ('space = "cmyk"', "space"),
    ('compression = "jpeg2000"', "compression"),
    ('naming = "../{stem}"', "separators"),
    ('naming = "{stem}/{recipe}"', "separators"),
    ('naming = "{stem}_{user}"', "unknown token"),
    ('quality = 0', "quality"),
    ('base = "nope"', "base"),
    ('colour = "srgb"', "colour"),
])
def test_studio_file_errors_name_the_file_and_the_recipe(tmp_path: Path, table: str, reason: str) -> None:
    path = tmp_path / "studio.toml"
    path.write_text(f"[recipes.broken]\n{table}\n")
    with pytest.raises(BadRecipe) as err:
        load_recipes_file(path)
    assert str(path) in err.value.detail and "'broken'" in err.value.detail and reason in err.value.detail
    path.write_text("[recipes.x\n")
    with pytest.raises(BadRecipe, match="cannot read"):
        load_recipes_file(path)


@pytest.mark.parametrize(("table", "reason"), [
    ('base = "jpeg-proof"\nbits = 16', "recipe 'web': bits: jpeg output is 8-bit, not 16"),  # RECIPES.md's example
    ('bits = 12', "recipe 'web': bits: tiff output is 8 or 16-bit, not 12"),
    ('format = "png"\ncompression = "lzw"',
     "recipe 'web': compression: compression 'lzw' is for TIFF; png has its own"),
    ('naming = "{user}"', "recipe 'web': naming: naming template '{user}': unknown token {user}"),
])
def test_studio_file_errors_name_the_field(tmp_path: Path, table: str, reason: str) -> None:
    """Found from outside: a format/bits or format/compression mismatch named no field ("recipe: Value error, jpeg
    output is 8-bit, not 16"); RECIPES.md promises the file, the recipe and the field."""
    path = tmp_path / "recipes.toml"
    path.write_text(f"[recipes.web]\n{table}\n")
    with pytest.raises(BadRecipe) as err:
        load_recipes_file(path)
    assert err.value.detail.startswith(f"{path}: {reason}")
    assert "Value error" not in err.value.detail


def test_a_broken_edit_of_the_studio_file_leaves_the_last_good_recipes_in_use(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Found from outside: a TOML typo while a night's shots waited failed every one of them at ingest, for good.
    Now the recipes as this process last read them stay in use, with one error in the log; a file never read whole
    is still refused."""
    import os

    path = tmp_path / "studio.toml"
    path.write_text('[recipes.web]\nbase = "jpeg-proof"\nlong_edge = 2048\n')
    assert catalogue(path)["web"].long_edge == 2048
    path.write_text('[recipes.web\nbase = "jpeg-proof"\n')  # the edit half done
    os.utime(path, ns=(1, 1))  # a new modification time however fast the test runs
    with caplog.at_level("ERROR"):
        assert catalogue(path)["web"].long_edge == 2048 and catalogue(path)["tiff16"]
    assert sum("cannot read the recipes file" in r.message for r in caplog.records) == 1
    path.write_text('[recipes.web]\nbase = "jpeg-proof"\nlong_edge = 1024\n')  # fixed
    assert catalogue(path)["web"].long_edge == 1024
    other = tmp_path / "never.toml"
    other.write_text("[recipes.x\n")
    with pytest.raises(BadRecipe, match="cannot read"):
        catalogue(other)
    path.unlink()  # gone: the last good recipes still serve
    assert catalogue(path)["web"].long_edge == 1024


def test_naming_templates_are_checked_and_names_sanitised() -> None:
    assert validate_template("{stem}_{recipe}") == "{stem}_{recipe}"
    for bad in ("a/b", "a\\b", "..{stem}", "{stem}_{nope}", "{seq:08d}", "{stem!r}", "{", ""):
        with pytest.raises(BadNaming):
            validate_template(bad)
    assert sanitise("Été 2026: shot #1") == "Ete_2026_shot_1"
    assert sanitise("..hidden..name..") == "hidden.name"
    assert len(sanitise("x" * 500)) == 150 and sanitise("///") == "output"
    tokens = NameTokens("st", "cam/../x", "2026-11-30", "frame_00", 1, "j")
    assert render_name("{camera}_{stem}", tokens, "tiff16", "tif") == "cam_._x_frame_00.tif"


def test_names_of_one_job_never_collide() -> None:
    recipes = resolve_recipes(["tiff16", "tiff16-adobergb", "jpeg-proof"])
    assert output_names(recipes, TOKENS) == ["frame_00.tif", "frame_00_tiff16-adobergb.tif",
                                             "frame_00_jpeg-proof.jpg"]
    same = [r.model_copy(update={"naming": "{stem}"}) for r in recipes]
    assert output_names(same, TOKENS) == ["frame_00.tif", "frame_00_2.tif", "frame_00.jpg"]
    assert unique_names(["a.tif", "A.tif", "a.tif"]) == ["a.tif", "A_2.tif", "a_3.tif"]


def test_a_recipe_can_ask_for_the_fast_or_best_model() -> None:
    fast, tiff = BUILTIN_RECIPES["tiff16-fast"], BUILTIN_RECIPES["tiff16"]
    assert fast.model == "fast" and tiff.model is None and fast.to_public()["model"] == "fast"
    assert job_model_tier([tiff], "best") == "best" and job_model_tier([tiff], "fast") == "fast"
    assert job_model_tier([fast, tiff], "best") == "fast"  # the only recipe that asks decides
    assert job_model_tier([fast, Recipe(name="x", model="best")], "fast") == "best"  # best wins: one render
    best_max = BUILTIN_RECIPES["tiff16-max"]
    assert best_max.model == "max" and job_model_tier([fast, best_max, tiff], "best") == "max"  # the most thorough
    assert job_model_tier([Recipe(name="x", model="best"), fast], "max") == "best"  # asked for beats the setting
    with pytest.raises(ValueError, match="model"):
        Recipe(name="x", model="huge")
