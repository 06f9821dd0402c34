"""Data loading on real data: sklearn digits, Fashion-MNIST (when installed), image folders of real photos
(skimage.data) with broken files, CSV manifests, and the transforms built from a model's preprocessing."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import DataError
from vitkit.data import fashion_mnist
from vitkit.data.datasets import load_data, map_labels, stratified_split
from vitkit.data.transforms import eval_transform, train_transform
from vitkit.models.config import Preprocess
from vitkit.training.recipes import get_recipe


def test_digits_split_is_seeded_stratified_and_scaled():
    a = load_data("digits", seed=0)
    b = load_data("digits", seed=0)
    c = load_data("digits", seed=1)
    assert len(a.train) + len(a.test) == 1797 and a.val is None
    assert a.class_names == [str(i) for i in range(10)] and a.channels == 1 and a.image_size == (8, 8)
    assert torch.equal(a.test.labels, b.test.labels) and torch.equal(a.test.images, b.test.images)
    assert a.info["split_indices"]["test"] != c.info["split_indices"]["test"]
    x, _ = a.train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.uint8 and x.max() > 200  # 0..16 scaled to 0..255
    # every class in both splits, roughly 20% held out each
    counts = torch.bincount(a.test.labels, minlength=10)
    assert counts.min() >= 30
    assert set(a.info["split_indices"]["test"]).isdisjoint(range(0))


def test_val_fraction_carves_from_train_without_overlap():
    d = load_data("digits", seed=3, val_fraction=0.1)
    assert len(d.train) + len(d.val) + len(d.test) == 1797
    held = d.info["split_indices"]["val_from_train"]
    assert len(held) == len(d.val)


def test_val_from_digits_keeps_the_test_indices():
    d = load_data("digits", seed=0, val_fraction=0.1)
    assert len(d.info["split_indices"]["test"]) == len(d.test) == 359  # both splits recorded for config.json
    assert len(d.info["split_indices"]["val_from_train"]) == len(d.val)


def test_carved_val_holds_every_class_and_refuses_too_few(tmp_path):
    """A folder of real photos with 2-3 images per class: 15% rounds to 0 per class, yet each class gets one
    val image (and keeps at least one to train on); a class with a single image is a clear stop."""
    from vitkit.data.datasets import DEFAULT_VAL_FRACTION, default_val_fraction

    _write_tree(tmp_path / "imgs", broken=False)
    Image.fromarray(_photos()["cat"][0]).resize((48, 40)).save(tmp_path / "imgs" / "cat" / "2.png")
    d = load_data(str(tmp_path / "imgs"), val_fraction=DEFAULT_VAL_FRACTION, seed=0)
    assert sorted(d.val.labels.tolist()) == [0, 1, 2] and sorted(d.train.labels.tolist()) == [0, 1, 1, 2]
    assert d.info["split_indices"]["val_from_train"] == sorted(d.info["split_indices"]["val_from_train"])
    assert default_val_fraction("digits") == 0 and default_val_fraction(str(tmp_path)) == DEFAULT_VAL_FRACTION
    (tmp_path / "imgs" / "coffee" / "1.jpg").unlink()
    with pytest.raises(DataError, match=r"class 'coffee' has 1 image\(s\); a validation split needs at least 2"):
        load_data(str(tmp_path / "imgs"), val_fraction=0.15)
    assert len(load_data(str(tmp_path / "imgs")).train) == 6  # no split asked: every image trains


def test_stratified_split_keeps_every_class():
    keep, held = stratified_split([0, 0, 0, 1, 2, 2], 0.5, seed=0)
    assert sorted(keep + held) == list(range(6))
    assert {0, 1, 2} <= {[0, 0, 0, 1, 2, 2][i] for i in keep}


@pytest.mark.skipif(fashion_mnist.find_local() is None, reason="Fashion-MNIST not installed "
                    "(apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_real_files():
    d = load_data("fashion-mnist")
    assert len(d.train) == 60000 and len(d.test) == 10000
    assert d.train.images.shape == (60000, 1, 28, 28) and d.train.images.dtype == torch.uint8
    assert torch.bincount(d.train.labels).tolist() == [6000] * 10
    assert torch.bincount(d.test.labels).tolist() == [1000] * 10
    assert d.class_names[0] == "T-shirt/top" and d.class_names[9] == "Ankle boot"


def test_fashion_mnist_absent_offline_names_both_routes(monkeypatch, tmp_path):
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "none")
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VITKIT_FASHION_MNIST", raising=False)
    monkeypatch.setenv("VITKIT_OFFLINE", "1")
    with pytest.raises(Exception) as e:
        load_data("fashion-mnist")
    msg = str(e.value)
    assert "apt-get install dataset-fashion-mnist" in msg and fashion_mnist.URL in msg


def test_idx_reader_rejects_truncated_file(tmp_path):
    import gzip

    p = tmp_path / "bad-images-idx3-ubyte.gz"
    with gzip.open(p, "wb") as f:
        f.write(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x00" * 100)
    with pytest.raises(DataError, match="truncated"):
        fashion_mnist.read_idx(p)


# ---------------------------------------------------------------------------- user folders of real photos
def _photos():
    from skimage import data

    return {"cat": [data.chelsea(), data.chelsea()[::-1]], "coffee": [data.coffee(), data.coffee()[:, ::-1]],
            "camera": [data.camera(), data.camera()[::-1]]}  # camera is grayscale


def _write_tree(root, broken=True):
    for cls, imgs in _photos().items():
        (root / cls).mkdir(parents=True)
        for i, a in enumerate(imgs):
            Image.fromarray(np.ascontiguousarray(a)).resize((48, 40)).save(root / cls / f"{i}.{'jpg' if i else 'png'}")
    if broken:
        good = (root / "cat" / "1.jpg").read_bytes()
        (root / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 3])
        (root / "coffee" / "empty.png").write_bytes(b"")


def test_image_folder_skips_and_counts_broken_files(tmp_path, caplog):
    _write_tree(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        d = load_data(str(tmp_path), seed=0, channels=3)
    assert d.class_names == ["camera", "cat", "coffee"]
    assert len(d.train) == 6 and d.info["num_skipped"] == 2
    assert {s["path"].rsplit("/", 1)[-1] for s in d.info["skipped"]} == {"truncated.jpg", "empty.png"}
    assert "skipped 2 unreadable" in caplog.text
    img, _ = d.train[0]
    assert img.mode == "RGB" and img.size == (48, 40) and d.image_size == (40, 48)
    with pytest.raises(DataError, match="strict"):
        load_data(str(tmp_path), strict=True)


def test_image_folder_train_val_subfolders_and_unknown_val_class(tmp_path):
    _write_tree(tmp_path / "train", broken=False)
    _write_tree(tmp_path / "val", broken=False)
    d = load_data(str(tmp_path), channels=1)
    assert len(d.train) == 6 and len(d.val) == 6 and d.test is None
    assert d.train[0][0].mode == "L"
    (tmp_path / "val" / "dog").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "val" / "dog" / "a.png")
    with pytest.raises(DataError, match="dog"):
        load_data(str(tmp_path))


def test_empty_class_folder_stops_with_clear_message(tmp_path):
    _write_tree(tmp_path, broken=False)
    (tmp_path / "zebra").mkdir()
    with pytest.raises(DataError, match="zebra.*no readable images"):
        load_data(str(tmp_path))


def test_csv_manifest_and_labels_outside_class_list(tmp_path):
    _write_tree(tmp_path / "imgs", broken=True)
    rows = ["path,label"] + [f"imgs/{p.parent.name}/{p.name},{p.parent.name}"
                             for p in sorted((tmp_path / "imgs").rglob("*.*"))]
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    d = load_data(str(tmp_path / "m.csv"), val_fraction=0.34, seed=0)
    assert d.class_names == ["camera", "cat", "coffee"] and d.info["num_skipped"] == 2
    assert len(d.train) + len(d.val) == 6 and len(d.val) == 3
    # a model trained on other classes: its class list does not hold these labels
    with pytest.raises(DataError, match="not among the model's classes"):
        map_labels(d, ["cat", "dog", "camera"])
    map_labels(d, ["coffee", "cat", "camera", "extra"])  # a superset re-indexes
    assert d.class_names[0] == "coffee"
    (tmp_path / "bad.csv").write_text("just-one-column\n")
    with pytest.raises(DataError, match="two columns"):
        load_data(str(tmp_path / "bad.csv"))


def test_transforms_follow_preprocess_and_channels():
    pre = Preprocess((0.5,), (0.5,), "bilinear", 1.0, (1, 28, 28))
    x = torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8)
    y = eval_transform(pre)(x)
    assert y.shape == (1, 28, 28) and y.dtype == torch.float32
    torch.testing.assert_close(y, x.float() / 255 * 2 - 1)
    pre3 = Preprocess((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bicubic", 0.875, (3, 32, 32))
    assert eval_transform(pre3)(x).shape == (3, 32, 32)  # gray into a 3-channel model
    recipe = get_recipe("fashion-mnist").replace(auto_augment="rand", reprob=0.25, crop="rrc")
    assert train_transform(pre3, recipe)(Image.new("RGB", (50, 40))).shape == (3, 32, 32)


def test_small_image_upscaled_more_than_4x_gets_a_note():
    """A 5x5 image into a 224 px model is enlarged ~50x (the eval resize to 248, then the 224 crop): a note
    says so. 4x or less, and downscaling, say nothing (the channel/size note covers big images)."""
    from vitkit.data.transforms import conversion_note

    pre = Preprocess(crop_pct=0.9, input_size=(3, 224, 224))  # eval resize: shorter side to floor(224 / 0.9)
    note = conversion_note(pre, [("/x/tiny.png", (5, 5, 3, "RGB"))])
    assert note == ("note: tiny.png is 5x5 px, upscaled 50x to the model's 224x224 input; "
                    "predictions on images this small are unreliable")
    assert conversion_note(pre, [("a.png", (62, 80, 3, "RGB"))]) is None  # 248 / 62 = 4.0x: not more than 4x
    assert "upscaled 4.1x" in conversion_note(pre, [("a.png", (61, 80, 3, "RGB"))])  # 248 / 61 = 4.07x
    several = conversion_note(pre, [("a.png", (5, 5, 3, "RGB")), ("b.png", (300, 451, 3, "RGB")),
                                    ("c.png", (20, 10, 3, "RGB")), ("d.png", (8, 8, 3, "RGB"))])
    assert several.startswith("note: a.png is 5x5 px") and several.endswith("(2 more images likewise)")
    gray_tiny = conversion_note(pre, [("g.png", (5, 5, 1, "L"))])  # both notes, one line
    assert "\n" not in gray_tiny and "(g.png was 5x5 grayscale)" in gray_tiny and "g.png is 5x5 px" in gray_tiny


def test_predict_prints_the_upscale_note_once(tmp_path, capsys):
    import json

    import vitkit
    from vitkit.cli.main import main

    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", embed_dim=32, depth=1, num_heads=2, num_classes=3)
    ckpt = vitkit.save_model(model, tmp_path / "m.safetensors", class_names=["a", "b", "c"])
    Image.fromarray(skimage_photo()).resize((5, 5), Image.Resampling.BILINEAR).save(tmp_path / "tiny.png")
    Image.fromarray(skimage_photo()).save(tmp_path / "photo.png")  # 451x300: about 1.2x, no note
    assert main(["predict", str(ckpt), str(tmp_path / "tiny.png"), str(tmp_path / "photo.png"), "--json"]) == 0
    out = capsys.readouterr()
    assert len(json.loads(out.out)["predictions"]) == 2
    assert out.err.splitlines() == ["note: tiny.png is 5x5 px, upscaled 50x to the model's 224x224 input; "
                                    "predictions on images this small are unreliable"]
    assert main(["predict", str(ckpt), str(tmp_path / "photo.png")]) == 0
    assert capsys.readouterr().err == ""


def skimage_photo():
    import skimage.data

    return skimage.data.chelsea()  # 451x300 RGB


def test_builtin_sets_come_from_one_table_that_names_each_task(tmp_path):
    """The built-in names, their aliases and each set's task are read from BUILTIN_SETS; a user folder is
    classification whatever its name (a folder called canvas-* holds class folders, not masks)."""
    from vitkit.data.builtin import BUILTIN_SETS, CLASSIFICATION, SEGMENTATION, builtin_set, dataset_task
    from vitkit.data.canvas import SPECS
    from vitkit.data.datasets import BUILTIN, BUILTIN_ALIASES, same_data

    assert BUILTIN == tuple(BUILTIN_SETS) and set(SPECS) <= set(BUILTIN)
    assert set(BUILTIN_ALIASES) == {a for name, s in BUILTIN_SETS.items() for a in (name, *s.aliases)}
    assert {n: s.task for n, s in BUILTIN_SETS.items() if s.task == SEGMENTATION} == dict.fromkeys(SPECS, SEGMENTATION)
    assert dataset_task("fmnist") == dataset_task("digits") == CLASSIFICATION
    assert dataset_task("canvas-digits") == SEGMENTATION
    assert builtin_set("fashion_mnist")[0] == "fashion-mnist" and builtin_set(str(tmp_path)) is None
    assert same_data("fmnist", "fashion-mnist") and not same_data("digits", "canvas-digits")
    assert dataset_task(str(tmp_path / "canvas-mine")) == CLASSIFICATION
    canvas = load_data("canvas-digits")  # the table's loader gives the same canvases as the canvas module's spec
    assert canvas.name == "canvas-digits" and len(canvas.train) == SPECS["canvas-digits"].train


def test_the_data_package_has_no_import_cycle():
    """canvas builds on the digits / Fashion-MNIST bundles without importing datasets back."""
    from test_import_graph import cycles, graph

    data_cycles = [c for c in cycles(graph()) if any(m.startswith("vitkit.data") for m in c)]
    assert not data_cycles, data_cycles
