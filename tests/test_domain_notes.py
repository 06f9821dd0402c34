"""A model trained on small gray images, given a large colour photo (or the reverse), says once what the
images became; matching data says nothing. The note is on stderr, so `--json` stdout stays JSON."""
from __future__ import annotations

import json

import pytest
import skimage.data
import torch
from PIL import Image

import vitkit
from vitkit.cli.main import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("notes")
    Image.fromarray(skimage.data.chelsea()).save(d / "chelsea.png")  # 451x300 RGB
    Image.fromarray(skimage.data.coffee()).save(d / "coffee.jpg")  # 600x400 RGB
    Image.fromarray(skimage.data.camera()).save(d / "camera.png")  # 512x512 gray
    camera = Image.fromarray(skimage.data.camera())
    camera.resize((28, 28), Image.Resampling.BILINEAR).save(d / "small.png")  # what fashion-mnist looks like
    camera.resize((112, 112), Image.Resampling.BILINEAR).save(d / "x4.png")  # 4x the side: still fine
    camera.resize((120, 120), Image.Resampling.BILINEAR).save(d / "x4plus.png")  # more than 4x
    torch.manual_seed(0)
    rgb = vitkit.create_model("vit_tiny_patch16_224", embed_dim=32, depth=1, num_heads=2, img_size=128,
                              num_classes=3)
    vitkit.save_model(rgb, d / "rgb128.safetensors", class_names=["a", "b", "c"])
    return d


def run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out, [line for line in out.err.splitlines() if line.strip()]


def test_photo_into_the_bundled_28px_gray_model_prints_one_note(files, capsys):
    out, err = run(capsys, ["predict", "bundled:fashion-mnist", str(files / "chelsea.png"), str(files / "coffee.jpg"),
                            "--json"])
    d = json.loads(out)  # stdout is only JSON
    assert len(d["predictions"]) == 2 and "note:" not in out
    assert d["predictions"][0]["source"] == {"width": 451, "height": 300, "channels": 3, "mode": "RGB"}
    assert err == ["note: images are converted to 1-channel 28x28 as the model was trained on fashion-mnist "
                   "(chelsea.png was 451x300 RGB; 1 more image likewise)"]
    out, err = run(capsys, ["predict", "bundled:fashion-mnist", str(files / "coffee.jpg")])  # table output too
    assert len(err) == 1 and "coffee.jpg was 600x400 RGB" in err[0] and "note:" not in out


def test_matching_data_prints_no_note(files, capsys):
    _, err = run(capsys, ["predict", "bundled:fashion-mnist", str(files / "small.png"), str(files / "x4.png"), "--json"])
    assert err == []
    _, err = run(capsys, ["predict", str(files / "rgb128.safetensors"), str(files / "chelsea.png"),
                          str(files / "coffee.jpg")])
    assert err == []  # colour photos 2-3x a colour model's input


def test_size_alone_and_channels_alone_are_mismatches(files, capsys):
    _, err = run(capsys, ["predict", "bundled:fashion-mnist", str(files / "x4plus.png"), "--json"])
    assert len(err) == 1 and "(x4plus.png was 120x120 grayscale)" in err[0]
    _, err = run(capsys, ["predict", str(files / "rgb128.safetensors"), str(files / "chelsea.png"),
                          str(files / "camera.png"), "--json"])
    assert err == ["note: images are converted to 3-channel 128x128 as the model was trained "
                   "(camera.png was 512x512 grayscale)"]


def test_explain_prints_the_same_single_note(files, capsys, tmp_path):
    out, err = run(capsys, ["explain", "bundled:fashion-mnist", str(files / "chelsea.png"), str(files / "coffee.jpg"),
                            "--out", str(tmp_path), "--json"])
    assert len(json.loads(out)["images"]) == 2
    assert len(err) == 1 and err[0].startswith("note: images are converted to 1-channel 28x28")
    _, err = run(capsys, ["explain", "bundled:fashion-mnist", str(files / "small.png"), "--out", str(tmp_path)])
    assert err == []
