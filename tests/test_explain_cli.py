"""`vitkit explain` and `vitkit analyze` end to end on real photos (skimage.data) and real datasets."""
import csv
import json
from pathlib import Path

import pytest
import skimage.data
import torch
from PIL import Image

import vitkit
from vitkit.analysis.inputs import sample_images
from vitkit.cli.main import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("explain")
    torch.manual_seed(0)
    rgb = vitkit.create_model("vit_tiny_patch16_224", embed_dim=32, depth=3, num_heads=4, img_size=32,
                              patch_size=8, num_classes=5)
    vitkit.save_model(rgb, d / "rgb.safetensors", class_names=list("abcde"))
    gray = vitkit.create_model("vit_pico_patch2_8", embed_dim=24, depth=2, num_heads=2, num_classes=10)
    vitkit.save_model(gray, d / "gray.safetensors")
    photos = d / "photos"
    (photos / "sub").mkdir(parents=True)
    Image.fromarray(skimage.data.astronaut()).save(photos / "astronaut.png")
    Image.fromarray(skimage.data.chelsea()).save(photos / "sub" / "chelsea.jpg")  # 451x300: not square
    Image.fromarray(skimage.data.camera()).save(photos / "camera.png")  # grayscale
    (d / "broken.png").write_bytes(skimage.data.astronaut().tobytes()[:500])
    return d


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def explain_json(capsys, argv):
    """The one image's entry of `vitkit explain --json` with a single image."""
    d = run_json(capsys, argv)
    assert d["errors"] == [] and len(d["images"]) == 1
    return d["images"][0]


def png_size(path):
    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


@pytest.mark.parametrize("method", ["rollout", "cls-attention", "grad-rollout"])
def test_explain_writes_overlay_and_head_grid(files, capsys, method):
    out = files / f"out-{method}.png"
    extra = ["--class", "3"] if method == "grad-rollout" else ["--head-fusion", "max", "--discard-ratio", "0.2"]
    info = explain_json(capsys, ["explain", str(files / "rgb.safetensors"), str(files / "photos/sub/chelsea.jpg"),
                             "--method", method, "--out", str(out)] + extra)
    assert info["grid"] == [4, 4] and info["input_size"] == [32, 32]
    assert info["top"][0]["name"] in list("abcde") and len(info["top"]) == 5
    assert info["target"] == (3 if method == "grad-rollout" else info["top"][0]["class"])
    assert png_size(out) == (800, 450) and out.stat().st_size > 5000
    assert png_size(info["heads_out"]) == (1000, 310)  # 4 heads: 4 columns x 1 row


def test_explain_non_square_size_and_grayscale_model(files, capsys):
    info = explain_json(capsys, ["explain", str(files / "rgb.safetensors"), str(files / "photos/astronaut.png"),
                             "--img-size", "32x56", "--out", str(files / "wide.png")])
    assert info["grid"] == [4, 7]
    info = explain_json(capsys, ["explain", str(files / "gray.safetensors"), str(files / "photos/astronaut.png"),
                             "--out", str(files / "gray.png")])
    assert info["grid"] == [4, 4] and png_size(files / "gray.png") == (800, 450)


def test_explain_errors_are_one_line(files, capsys):
    rc = main(["explain", str(files / "rgb.safetensors"), str(files / "broken.png")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "broken.png" in err and "corrupt" in err
    rc = main(["explain", str(files / "rgb.safetensors"), str(files / "photos/camera.png"),
               "--method", "grad-rollout", "--class", "7"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "out of range" in err and len(err.splitlines()) == 1


def test_analyze_folder_writes_csv_figures_and_object_mass(files, capsys):
    out = files / "analysis"
    info = run_json(capsys, ["analyze", str(files / "rgb.safetensors"), "--data", str(files / "photos"),
                             "--out", str(out), "--object-mass", "0.3"])
    assert info["images"] == 3 and "3 of 3" in info["sample"]
    with open(out / "attention_distance.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 4  # layers x heads
    for r in rows:
        assert float(r["mean_distance_px"]) == pytest.approx(
            info["mean_distance_px"][int(r["layer"]) - 1][int(r["head"])], abs=1e-3)
        assert 0 < float(r["mean_distance_px"]) < 32 * 2**0.5
    assert png_size(out / "attention_distance.png") == (700, 450)
    assert png_size(out / "pos_embed_similarity.png") == (700, 650)
    assert png_size(out / "patch_filters_pca.png") == (840, 560)  # 28 components, 7 x 4 tiles
    om = info["object_mass"]
    assert 0 <= om["mass"] <= 1 and 0 < om["share"] < 1 and om["n"] == 3
    assert json.loads((out / "summary.json").read_text())["mean_distance_px"] == info["mean_distance_px"]


def test_analyze_builtin_digits_and_glob(files, capsys):
    info = run_json(capsys, ["analyze", str(files / "gray.safetensors"), "--data", "digits", "--samples", "16",
                             "--components", "5", "--out", str(files / "digits")])
    assert info["images"] == 16 and len(info["per_layer_mean_px"]) == 2
    # 1-channel 2x2 filters span only 4 dimensions: 4 components, one row of 4 tiles
    assert png_size(files / "digits/patch_filters_pca.png") == (480, 200)
    info = run_json(capsys, ["analyze", str(files / "rgb.safetensors"), "--data", str(files / "photos/**/*.jpg"),
                             "--out", str(files / "glob")])
    assert info["images"] == 1


def test_analyze_bad_data_is_one_line(files, capsys):
    rc = main(["analyze", str(files / "rgb.safetensors"), "--data", str(files / "nothing-here"),
               "--out", str(files / "x")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "nothing-here" in err and len(err.splitlines()) == 1


def test_fashion_mnist_sample_reads_the_idx_files():
    from vitkit.data import fashion_mnist

    if fashion_mnist.find_local() is None:
        pytest.skip("Fashion-MNIST not present")
    ims, desc = sample_images("fashion-mnist", 4, channels=1)
    assert len(ims) == 4 and "test split (4 of 10000" in desc
    assert all(im.size == (28, 28) and im.mode == "L" for im in ims)
    import numpy as np

    pix = np.stack([np.asarray(im) for im in ims])
    assert pix.max() > 200 and (pix == 0).mean() > 0.2  # bright garments on a black background


def test_explain_headless_model(files, capsys, tmp_path):
    torch.manual_seed(0)
    m = vitkit.create_model("vit_tiny_patch16_224", embed_dim=32, depth=2, num_heads=2, img_size=32, patch_size=8,
                            num_classes=0)
    vitkit.save_model(m, tmp_path / "headless.safetensors")
    info = explain_json(capsys, ["explain", str(tmp_path / "headless.safetensors"), str(files / "photos/camera.png"),
                             "--out", str(tmp_path / "h.png")])
    assert info["top"] == [] and info["target"] is None and png_size(tmp_path / "h.png") == (800, 450)
    rc = main(["explain", str(tmp_path / "headless.safetensors"), str(files / "photos/camera.png"),
               "--method", "grad-rollout", "--out", str(tmp_path / "g.png")])
    assert rc == 2 and "classification head" in capsys.readouterr().err


def test_reports_are_library_calls(files, tmp_path):
    from vitkit.analysis.report import analyze, explain_image

    model = vitkit.load_model(files / "rgb.safetensors").eval()
    photo = Image.fromarray(skimage.data.astronaut())
    summary = analyze(model, [photo, photo.rotate(90)], tmp_path / "an", components=4, object_mass_threshold=0.3)
    assert summary["images"] == 2 and summary["checkpoint"] is None and summary["filter_components"] == 4
    assert json.loads((tmp_path / "an/summary.json").read_text()) == summary
    assert png_size(summary["files"]["filters_png"]) == (480, 200)  # 4 components: one row of 4 tiles
    info = explain_image(model, photo, tmp_path / "ex.png", method="grad-rollout", target=1, size=(32, 48))
    assert info["grid"] == [4, 6] and info["target"] == 1 and len(info["top"]) == 5
    r, c = info["peak_patch"]
    assert 0 <= r < 4 and 0 <= c < 6 and png_size(info["heads_out"]) == (1000, 310)


def test_explain_several_images_into_a_folder_one_figure_pair_per_image_and_method(files, capsys):
    """Several images: one heat map + head grid each; rollout then grad-rollout into the same folder
    overwrites nothing (the method is in every name)."""
    imgs = [files / "photos/astronaut.png", files / "photos/sub/chelsea.jpg", files / "photos/camera.png"]
    out = files / "maps"
    written = {}
    for method in ("rollout", "grad-rollout"):
        d = run_json(capsys, ["explain", str(files / "rgb.safetensors"), *map(str, imgs), "--method", method,
                              "--out", str(out)])
        assert d["method"] == method and d["errors"] == [] and [e["image"] for e in d["images"]] == list(map(str, imgs))
        for e in d["images"]:
            assert method in e["out"] and e["out"].startswith(str(out))
            written[e["out"]] = Path(e["out"]).read_bytes()
            written[e["heads_out"]] = Path(e["heads_out"]).read_bytes()
    assert len(written) == 12  # 3 images x 2 methods x (heat map + head grid), all distinct names
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{stem}-{m}{tail}" for stem in ("astronaut", "chelsea", "camera") for m in ("rollout", "grad-rollout")
        for tail in (".png", "-heads.png"))
    for path, content in written.items():  # the second method did not overwrite the first one's files
        assert Path(path).read_bytes() == content and png_size(path)[0] > 0
    heat = {m: (out / f"chelsea-{m}.png").read_bytes() for m in ("rollout", "grad-rollout")}
    assert heat["rollout"] != heat["grad-rollout"]


def test_explain_out_pattern_default_names_and_refusals(files, capsys, tmp_path, monkeypatch):
    imgs = [str(files / "photos/astronaut.png"), str(files / "photos/sub/chelsea.jpg")]
    d = run_json(capsys, ["explain", str(files / "rgb.safetensors"), *imgs, "--method", "cls-attention",
                          "--out", str(tmp_path / "p/{index}_{stem}_{method}.png")])
    assert [e["out"] for e in d["images"]] == [str(tmp_path / "p/1_astronaut_cls-attention.png"),
                                               str(tmp_path / "p/2_chelsea_cls-attention.png")]
    assert all(png_size(e["out"]) == (800, 450) for e in d["images"])
    monkeypatch.chdir(tmp_path)  # default: IMAGE_STEM-METHOD.png here
    for method in ("rollout", "grad-rollout"):
        run_json(capsys, ["explain", str(files / "rgb.safetensors"), imgs[1], "--method", method])
    assert (tmp_path / "chelsea-rollout.png").is_file() and (tmp_path / "chelsea-grad-rollout.png").is_file()
    # same stem in two folders: both kept
    (tmp_path / "b").mkdir()
    Image.open(imgs[1]).save(tmp_path / "b/chelsea.png")
    d = run_json(capsys, ["explain", str(files / "rgb.safetensors"), imgs[1], str(tmp_path / "b/chelsea.png"),
                          "--out", "same"])
    assert [e["out"] for e in d["images"]] == ["same/chelsea-1-rollout.png", "same/chelsea-2-rollout.png"]
    # one FILE.png for several images, or a pattern that collides: one line, nothing written
    for out in (str(tmp_path / "one.png"), str(tmp_path / "{method}.png")):
        rc = main(["explain", str(files / "rgb.safetensors"), *imgs, "--out", out])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "--out" in err
    assert not (tmp_path / "one.png").exists() and not (tmp_path / "rollout.png").exists()


def test_explain_broken_image_among_several_keeps_the_others(files, capsys, tmp_path):
    rc = main(["explain", str(files / "rgb.safetensors"), str(files / "broken.png"), str(files / "photos/camera.png"),
               "--out", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert rc == 2
    d = json.loads(captured.out)
    assert [e["image"] for e in d["errors"]] == [str(files / "broken.png")]
    assert len(d["images"]) == 1 and png_size(tmp_path / "camera-rollout.png") == (800, 450)
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert len(errors) == 1 and "broken.png" in errors[0]
    # plus the one note: a gray 512x512 photo into this 32x32 colour model
    assert [line for line in captured.err.splitlines() if line.startswith("note:")] == [
        "note: images are converted to 3-channel 32x32 as the model was trained (camera.png was 512x512 grayscale)"]
