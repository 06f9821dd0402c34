"""Dense patch features (analysis/dense.py): DINOv2's PCA map and mutual patch matching, for every family with
the feature contract, through `vitkit explain --method pca|match`."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

import vitkit
from vitkit.analysis.dense import mutual_matches, pca_rgb
from vitkit.cli.main import main as cli


def test_pca_separates_an_object_from_its_background_and_scales_to_rgb():
    g = torch.Generator().manual_seed(0)
    d, h, w = 16, 8, 8
    fmap = 0.05 * torch.randn(d, h, w, generator=g)
    fmap[:, 2:6, 2:6] += torch.randn(d, 1, 1, generator=g) * 3 + 0.3 * torch.randn(d, 4, 4, generator=g)  # object
    rgb, fg = pca_rgb(fmap)
    assert rgb.shape == (h, w, 3) and rgb.min() >= 0 and rgb.max() <= 1
    expect = torch.zeros(h, w, dtype=torch.bool)
    expect[2:6, 2:6] = True
    assert torch.equal(fg, expect)  # the object, whatever the sign of the first component
    assert rgb[~fg].abs().sum() == 0 and rgb[fg].max() == pytest.approx(1.0)  # background black
    keep_all, everything = pca_rgb(fmap, remove_background=False)
    assert everything.all() and keep_all.reshape(-1, 3).max(0).values.tolist() == pytest.approx([1, 1, 1])


def test_mutual_matches_find_a_shifted_copy():
    fmap = torch.randn(32, 6, 6, generator=torch.Generator().manual_seed(1))
    shifted = torch.roll(fmap, shifts=1, dims=2)  # every patch one column to the right (wrapping)
    pairs = mutual_matches(fmap, shifted, top=100)
    assert len(pairs) == 36
    assert all(p["b"] == (p["a"][0], (p["a"][1] + 1) % 6) and p["similarity"] == pytest.approx(1.0) for p in pairs)
    assert len(mutual_matches(fmap, shifted, top=5)) == 5


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from skimage import data

    d = tmp_path_factory.mktemp("photos")
    paths = []
    for name in ("astronaut", "coffee"):
        p = d / f"{name}.png"
        Image.fromarray(getattr(data, name)()).save(p)
        paths.append(p)
    return paths


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "resnet18"])
def test_explain_pca_writes_a_map_for_any_family_finer_at_a_larger_size(name, photos, tmp_path, capsys):
    torch.manual_seed(0)
    kw = {"depth": 2} if name.startswith("vit") else {}
    ckpt = vitkit.save_model(vitkit.create_model(name, img_size=64, **kw), tmp_path / "m.safetensors")
    out = tmp_path / "maps"
    assert cli(["explain", str(ckpt), str(photos[0]), "--method", "pca", "--out", str(out), "--json"]) == 0
    small = json.loads(capsys.readouterr().out)["images"][0]
    assert (out / "astronaut-pca.png").stat().st_size > 0
    assert cli(["explain", str(ckpt), str(photos[0]), "--method", "pca", "--img-size", "128", "--out",
                str(tmp_path / "big.png"), "--json"]) == 0
    big = json.loads(capsys.readouterr().out)["images"][0]
    assert big["grid"][0] == 2 * small["grid"][0] and Image.open(tmp_path / "big.png").format == "PNG"


def test_explain_match_draws_two_images_and_refuses_one(photos, tmp_path, capsys):
    torch.manual_seed(0)
    ckpt = vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2), tmp_path / "m.safetensors")
    assert cli(["explain", str(ckpt), *map(str, photos), "--method", "match", "--matches", "7",
                "--out", str(tmp_path / "match.png"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert 1 <= len(info["matches"]) <= 7 and (tmp_path / "match.png").stat().st_size > 0
    sims = [m["similarity"] for m in info["matches"]]
    assert sims == sorted(sims, reverse=True)
    assert cli(["explain", str(ckpt), str(photos[0]), "--method", "match"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two images" in err[0]
