"""`vitkit eval` and `vitkit predict` on a freshly trained digits checkpoint and real PNG files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.cli.main import main as cli
from vitkit.data.datasets import load_data


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert cli(["train", "--out", str(out), "--epochs", "3", "--set", "batch_size=32", "--set", "lr=3e-3",
                "--set", "crop=none", "--set", "warmup_epochs=0.5", "--set", "threads=1", "--quiet"]) == 0
    return out / "best.safetensors"


def test_eval_json_reports_top1_top5_per_class_and_confusion(ckpt, capsys):
    assert cli(["eval", str(ckpt), "--data", "digits", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["split"] == "test" and d["count"] == 359
    assert 30 < d["top1"] <= d["top5"] <= 100
    assert len(d["per_class"]) == 10 and sum(c["support"] for c in d["per_class"]) == 359
    conf = np.array(d["confusion"])
    assert conf.shape == (10, 10) and conf.sum() == 359
    assert np.trace(conf) / 359 * 100 == pytest.approx(d["top1"])
    summary = json.loads((ckpt.parent / "summary.json").read_text())
    assert d["top1"] == pytest.approx(summary["best"]["test_top1"], abs=1e-6)  # same model (best on val), same split


def test_predict_png_files_and_broken_file(ckpt, tmp_path, capsys):
    test = load_data("digits").test
    paths = []
    for i in range(4):
        img, label = test[i]
        p = tmp_path / f"digit{i}_{label}.png"
        Image.fromarray(img[0].numpy(), mode="L").save(p)
        paths.append(str(p))
    rgb = tmp_path / "rgb.jpg"  # colour input to a 1-channel model is converted
    Image.fromarray(np.repeat(test[5][0][0].numpy()[..., None], 3, axis=2)).resize((32, 32)).save(rgb)
    assert cli(["predict", str(ckpt), *paths, str(rgb), "--top-k", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["predictions"]) == 5 and d["errors"] == []
    for p in d["predictions"]:
        probs = [t["prob"] for t in p["top"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert p["top"][0]["label"] in [str(i) for i in range(10)]
    broken = tmp_path / "broken.png"
    broken.write_bytes(Path(paths[0]).read_bytes()[:40])
    rc = cli(["predict", str(ckpt), paths[0], str(broken)])
    captured = capsys.readouterr()
    assert rc == 2
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "broken.png" in lines[0]
    assert "digit0" in captured.out  # the good image is still classified


def test_onnx_backend_gives_the_same_answers(ckpt, tmp_path, capsys):
    from vitkit.export.onnx import export_onnx
    from vitkit.training.models import load_any

    onnx_path = tmp_path / "digits.onnx"
    export_onnx(load_any(ckpt).eval(), onnx_path)
    test = load_data("digits").test
    paths = []
    for i in range(6):
        p = tmp_path / f"d{i}.png"
        Image.fromarray(test[i][0][0].numpy(), mode="L").save(p)
        paths.append(str(p))
    results = {}
    for backend, model in (("torch", ckpt), ("onnx", onnx_path)):
        assert cli(["predict", str(model), *paths, "--backend", backend, "--json"]) == 0
        results[backend] = json.loads(capsys.readouterr().out)["predictions"]
    for a, b in zip(results["torch"], results["onnx"]):
        assert a["top"][0]["label"] == b["top"][0]["label"]
        assert a["top"][0]["prob"] == pytest.approx(b["top"][0]["prob"], abs=1e-4)
    assert cli(["eval", str(onnx_path), "--backend", "onnx", "--json"]) == 0
    onnx_eval = json.loads(capsys.readouterr().out)
    assert cli(["eval", str(ckpt), "--json"]) == 0
    assert onnx_eval["top1"] == pytest.approx(json.loads(capsys.readouterr().out)["top1"], abs=0.3)


BUNDLED = Path(__file__).parents[1] / "src" / "vitkit" / "assets" / "vit_fashion_mnist.safetensors"


@pytest.mark.skipif(not BUNDLED.exists(), reason="the bundled fashion-mnist checkpoint is not built yet")
def test_bundled_checkpoint_predicts_real_fashion_mnist(tmp_path, capsys):
    """The checkpoint shipped in the package works out of the box on real test images."""
    import vitkit

    model = vitkit.load_model("bundled:fashion-mnist")
    assert len(model.class_names) == 10 and model.provenance["accuracy"]["test_top1"] > 90
    try:
        test = load_data("fashion-mnist").test
    except vitkit.DataError as e:
        pytest.skip(f"Fashion-MNIST not installed: {e}")
    paths, labels = [], []
    for i in range(0, 2000, 100):
        img, label = test[i]
        p = tmp_path / f"f{i}.png"
        Image.fromarray(img[0].numpy(), mode="L").save(p)
        paths.append(str(p))
        labels.append(model.class_names[label])
    assert cli(["predict", "bundled:fashion-mnist", *paths, "--top-k", "1", "--json"]) == 0
    preds = [p["top"][0]["label"] for p in json.loads(capsys.readouterr().out)["predictions"]]
    assert sum(p == t for p, t in zip(preds, labels)) >= 16  # of 20; the model scores about 91%
    assert cli(["predict", "bundled:nope", paths[0]]) == 2
