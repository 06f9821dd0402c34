"""Using a trained detector: `vitkit predict` (boxes printed, drawn with --out, COCO results with --json FILE),
`vitkit eval` on a COCO file (mAP equal to pycocotools' COCOeval on the file predict wrote), `vitkit serve`'s
/v1/detect, and ONNX export checked against PyTorch. One small detector, trained in seconds, for the module."""
from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli
from vitkit.data.canvas import BOX_SPECS, paste_canvases
from vitkit.data.datasets import eval_loader, load_data

pytest.importorskip("pycocotools")

SIZE = (52, 60)  # the COCO file's images: (H, W), not the model's 48x48, so boxes go back through the eval map


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A task=detect run folder (ViT, FCOS, the default 64-wide pyramid) from a few steps on the built-in box set."""
    out = tmp_path_factory.mktemp("detect_run") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(BOX_SPECS, "canvas-digits-boxes", replace(BOX_SPECS["canvas-digits-boxes"], train=48, test=8))
        args = ["train", "--task", "detect", "--data", "canvas-digits-boxes", "--model", "vit_tiny_patch4_28",
                "--epochs", "1", "--out", str(out), "--quiet",
                *[a for kv in ("img_size=48", "in_chans=1", "model.depth=1", "model.embed_dim=32", "model.num_heads=2",
                               "steps_per_epoch=3", "batch_size=16", "lr=3e-3", "threads=1", "crop=none", "ema=false",
                               "eval_batch_size=64", "warmup_epochs=0") for a in ("--set", kv)]]
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(args) == 0
    return out


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> tuple[Path, dict]:
    """A real COCO-format file with PNGs in images/: digit canvases at SIZE, category ids 10, 20, ... named as the
    built-in set's classes ("0".."9"), image ids 100, 103, ..."""
    root = tmp_path_factory.mktemp("coco")
    spec = BOX_SPECS["canvas-digits-boxes"]
    src = load_data("digits")
    canv = paste_canvases(src.test.images[:80], src.test.labels[:80], 6, spec, seed=3)
    (root / "images").mkdir()
    sx, sy = SIZE[1] / spec.size, SIZE[0] / spec.size
    images, anns = [], []
    for i in range(len(canv.images)):
        name = f"canvas{i}.png"
        Image.fromarray(canv.images[i, 0].numpy()).resize(SIZE[::-1]).save(root / "images" / name)
        images.append({"id": 100 + 3 * i, "file_name": name, "height": SIZE[0], "width": SIZE[1]})
        for x0, y0, x1, y1, c in canv.boxes[i].tolist():
            anns.append({"id": len(anns) + 1, "image_id": 100 + 3 * i, "category_id": 10 * c, "iscrowd": 0,
                         "bbox": [x0 * sx, y0 * sy, (x1 - x0) * sx, (y1 - y0) * sy],
                         "area": (x1 - x0) * sx * (y1 - y0) * sy})
    data = {"images": images, "annotations": anns, "categories": [{"id": 10 * c, "name": str(c - 1)} for c in range(1, 11)]}
    path = root / "ann.json"
    path.write_text(json.dumps(data))
    return path, data


def _images(coco) -> list[Path]:
    path, data = coco
    return [path.parent / "images" / im["file_name"] for im in data["images"]]


def _cocoeval(ann: Path, predictions: Path) -> list[float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann))
        ev = COCOeval(gt, gt.loadRes(str(predictions)), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [100 * max(float(v), 0.0) for v in ev.stats[:3]]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_predict_prints_boxes_and_draws_them(run, coco, tmp_path, capsys):
    images = _images(coco)[:2]
    assert cli(["predict", str(run), *map(str, images), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    preds = out["predictions"]
    assert [p["image"] for p in preds] == [str(p) for p in images] and out["task"] == "detect"
    names = vitkit.load_model(run / "best.safetensors").class_names
    for p in preds:
        assert p["size"] == list(SIZE) and p["boxes"]
        for b in p["boxes"]:
            x0, y0, x1, y1 = b["box"]
            assert 0 <= x0 <= x1 <= SIZE[1] and 0 <= y0 <= y1 <= SIZE[0] and 0 < b["score"] <= 1
            assert b["label"] == names[b["index"]] and b["index"] >= 1
        assert [b["score"] for b in p["boxes"]] == sorted((b["score"] for b in p["boxes"]), reverse=True)
    # a threshold keeps the boxes at or above it, the same ones
    cut = float(np.median([b["score"] for b in preds[0]["boxes"]]))
    assert cli(["predict", str(run), str(images[0]), "--json", "--score-threshold", str(cut)]) == 0
    kept = json.loads(capsys.readouterr().out)["predictions"][0]["boxes"]
    above = [b for b in preds[0]["boxes"] if b["score"] >= cut]
    assert 0 < len(kept) < len(preds[0]["boxes"]) and abs(len(kept) - len(above)) <= 1  # one image, or two, a batch
    assert all(b["score"] >= cut for b in kept)
    for a, b in zip(kept, above):  # the same detections (a batch of one and of two agree to float rounding)
        assert a["index"] == b["index"] and a["score"] == pytest.approx(b["score"], abs=1e-5)
        assert a["box"] == pytest.approx(b["box"], abs=1e-3)
    # the table: one row per box, label, score and its corners
    assert cli(["predict", str(run), str(images[0]), "--score-threshold", str(cut)]) == 0
    text = capsys.readouterr().out
    first = kept[0]
    assert first["label"] in text and f"{first['score']:.3f}" in text
    assert " ".join(f"{v:.1f}" for v in first["box"]) in text
    # --out: each image with its boxes drawn, scaled up from these small images, the image's pixels elsewhere
    drawn = tmp_path / "drawn"
    assert cli(["predict", str(run), *map(str, images), "--out", str(drawn), "--score-threshold", str(cut)]) == 0
    capsys.readouterr()
    files = sorted(drawn.iterdir())
    assert [f.name for f in files] == sorted(f"{p.stem}.png" for p in images)
    with Image.open(drawn / f"{images[0].stem}.png") as im:
        got = np.asarray(im.convert("RGB")).astype(int)
    scale = got.shape[0] // SIZE[0]
    assert scale > 1 and got.shape[:2] == (SIZE[0] * scale, SIZE[1] * scale)
    plain = np.asarray(Image.open(images[0]).convert("RGB").resize(got.shape[1::-1], Image.NEAREST)).astype(int)
    changed = (got != plain).any(-1)
    x0, y0, x1, y1 = (round(v * scale) for v in first["box"])
    assert changed[max(y0, 1) - 1:y0 + 2, x0:x1].any(), "the top edge of the first box is drawn"
    colour = got[changed]
    assert (np.ptp(colour, axis=1) > 0).any(), "boxes are drawn in colour on the gray image"


def test_predict_json_file_equals_the_eval_and_cocoeval_on_it_equals_vitkit_eval(run, coco, tmp_path, capsys):
    """Must show: predict --json FILE holds the eval's own predictions (same checkpoint, same images), and
    COCOeval on that file gives `vitkit eval`'s map."""
    from vitkit.inference import load_detector
    from vitkit.training.tasks.detect import coco_results

    ann, data = coco
    pred = tmp_path / "pred.json"
    assert cli(["predict", str(run), *map(str, _images(coco)), "--coco", str(ann), "--json", str(pred)]) == 0
    capsys.readouterr()
    written = json.loads(pred.read_text())
    assert written and set(written[0]) == {"image_id", "category_id", "bbox", "score"}
    assert {r["image_id"] for r in written} <= {im["id"] for im in data["images"]}
    assert {r["category_id"] for r in written} <= {c["id"] for c in data["categories"]}
    # the eval's internal predictions: the task's own detect over the data pipeline's loader of the same file
    det = load_detector(str(run))
    bundle = load_data(str(ann), channels=1)
    detections, _, _ = det.task.predictions(det.model, eval_loader(bundle.train, det.preprocess))
    internal = coco_results(detections, bundle.train.category_ids)
    key = lambda r: (r["image_id"], -r["score"], r["category_id"], r["bbox"])  # noqa: E731
    assert len(written) == len(internal)
    for a, b in zip(sorted(written, key=key), sorted(internal, key=key)):
        assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"])
        assert a["score"] == pytest.approx(b["score"], abs=1e-4) and a["bbox"] == pytest.approx(b["bbox"], abs=1e-2)
    assert cli(["eval", str(run), "--data", str(ann), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["count"] == len(data["images"]) and set(ev["per_class"]) <= set(vitkit.load_model(run).class_names)
    reference = _cocoeval(ann, pred)
    assert reference[1] > 0, "the detector finds some boxes: the comparison is not 0 == 0"
    assert [ev["map"], ev["map_50"], ev["map_75"]] == pytest.approx(reference, abs=1e-6)


def test_predict_json_without_coco_numbers_the_images_and_keeps_labels(run, coco, tmp_path, capsys):
    images = _images(coco)[:3]
    pred = tmp_path / "pred.json"
    assert cli(["predict", str(run), *map(str, images), "--json", str(pred), "--score-threshold", "0.1"]) == 0
    text = capsys.readouterr().out
    assert str(pred) in text
    results = json.loads(pred.read_text())
    assert results and {r["image_id"] for r in results} <= {1, 2, 3} and all(r["score"] >= 0.1 for r in results)
    assert {r["category_id"] for r in results} <= set(range(1, 11))
    first = [r for r in results if r["image_id"] == 1]
    assert cli(["predict", str(run), str(images[0]), "--json", "--score-threshold", "0.1"]) == 0
    boxes = json.loads(capsys.readouterr().out)["predictions"][0]["boxes"]
    assert [r["bbox"] for r in first] == [pytest.approx([b["box"][0], b["box"][1], b["box"][2] - b["box"][0],
                                                         b["box"][3] - b["box"][1]], abs=2e-3) for b in boxes]


def test_bad_detection_inputs_say_one_line(run, coco, tmp_path, capsys):
    ann, data = coco
    images = _images(coco)
    # a classifier cannot write COCO detection results
    assert cli(["predict", "bundled:fashion-mnist", str(images[0]), "--json", str(tmp_path / "p.json")]) == 2
    line = _one_error_line(capsys)
    assert "detection" in line and "classifier" in line and "--json" in line
    # an image the annotation file does not list
    stranger = tmp_path / "stranger.png"
    Image.open(images[0]).save(stranger)
    assert cli(["predict", str(run), str(stranger), "--coco", str(ann), "--json", str(tmp_path / "p.json")]) == 2
    line = _one_error_line(capsys)
    assert "stranger.png" in line and "ann.json" in line and "file_name" in line
    assert not (tmp_path / "p.json").exists()
    # an annotation file whose categories are not the detector's classes
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data | {"categories": data["categories"][:4]}))
    assert cli(["predict", str(run), str(images[0]), "--coco", str(other), "--json", str(tmp_path / "p.json")]) == 2
    line = _one_error_line(capsys)
    assert "4 categories" in line and "10" in line
    # not a COCO file, --coco without a results file
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli(["predict", str(run), str(images[0]), "--coco", str(bad), "--json", str(tmp_path / "p.json")]) == 2
    assert "not a COCO annotation file" in _one_error_line(capsys)
    assert cli(["predict", str(run), str(images[0]), "--coco", str(ann)]) == 2
    assert "--json FILE" in _one_error_line(capsys)
    # two images of one name would draw to one file; a detector in OpenVINO
    twin = tmp_path / "twin"
    twin.mkdir()
    Image.open(images[0]).save(twin / images[0].name)
    assert cli(["predict", str(run), str(images[0]), str(twin / images[0].name), "--out", str(tmp_path / "d")]) == 2
    assert "distinct names" in _one_error_line(capsys) and not (tmp_path / "d").exists()
    assert cli(["predict", str(run), str(images[0]), "--backend", "openvino"]) == 2
    line = _one_error_line(capsys)
    assert "detector" in line and "OpenVINO" in line
    # a broken image among good ones: its line, the others still answered
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    assert cli(["predict", str(run), str(images[0]), str(broken), "--json"]) == 2
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["predictions"]) == 1
    assert len(captured.err.strip().splitlines()) == 1 and "broken.png" in captured.err


def test_serve_detects_and_refuses_predict_on_a_detector(run, coco, capsys):
    from fastapi.testclient import TestClient

    from vitkit.serve import create_app

    image = _images(coco)[0]
    assert cli(["predict", str(run), str(image), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)["predictions"][0]
    with TestClient(create_app(run, name="det", max_batch=4, batch_timeout_ms=5)) as c:
        r = c.post("/v1/detect", files={"file": ("c.png", image.read_bytes(), "application/octet-stream")})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["image"] == "c.png" and got["size"] == list(SIZE) and len(got["boxes"]) == len(want["boxes"])
        for a, b in zip(got["boxes"], want["boxes"]):
            assert (a["label"], a["index"]) == (b["label"], b["index"]) and a["score"] == pytest.approx(b["score"], abs=1e-5)
            assert a["box"] == pytest.approx(b["box"], abs=1e-3)
        r = c.post("/v1/predict", files={"file": ("c.png", image.read_bytes(), "application/octet-stream")})
        assert 400 <= r.status_code < 500 and "/v1/detect" in r.json()["error"]
        assert len(r.json()["error"].splitlines()) == 1
        info = c.get("/v1/model").json()
        assert info["task"] == "detect" and info["operations"]["detect"] is True
        assert info["operations"]["predict"] is False and info["detector"]["kind"] == "fcos"
        assert info["server"]["batches"]["detect"]["requests"] == 1
        page = c.get("/").text
        assert "/v1/detect" in page and "strokeRect" in page  # the page draws the boxes it gets
    with TestClient(create_app("bundled:fashion-mnist")) as c:  # a classifier has no /v1/detect
        r = c.post("/v1/detect", files={"file": ("c.png", image.read_bytes(), "application/octet-stream")})
        assert r.status_code == 400 and "detect" in r.json()["error"] and "classif" in r.json()["error"]
        assert c.get("/v1/model").json()["operations"]["detect"] is False


def _run_keeping_above(run: Path, folder: Path, images: list[Path]) -> Path:
    """A copy of the run whose detector keeps only boxes scoring above a threshold (its head's metadata saying
    `task.score_thresh`, as `--set task.score_thresh=S` would): the threshold at the 90th percentile of the
    scores on `images`, so that the number of boxes varies from image to image."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from vitkit.inference import detect_files, load_detector
    from vitkit.training.tasks.detect import HEAD_FILE, HEAD_META_KEY

    scores = [b["score"] for p in detect_files(load_detector(str(run)), images)[0] for b in p["boxes"]]
    folder.mkdir()
    shutil.copy(run / "best.safetensors", folder / "best.safetensors")
    with safe_open(str(run / HEAD_FILE), "pt") as f:
        options = json.loads(f.metadata()[HEAD_META_KEY])
    save_file(load_file(str(run / HEAD_FILE)), str(folder / HEAD_FILE),
              metadata={HEAD_META_KEY: json.dumps(options | {"score_thresh": float(np.quantile(scores, 0.9))})})
    return folder


def test_onnx_export_of_the_detector_matches_torch(run, coco, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from vitkit.export.onnx import OnnxRunner

    blank = tmp_path / "blank.png"
    Image.fromarray(np.zeros(SIZE, np.uint8)).save(blank)
    images = [*_images(coco)[:4], blank]
    sparse = _run_keeping_above(run, tmp_path / "sparse", images)
    out = tmp_path / "det.onnx"
    assert cli(["export", str(sparse), "--onnx", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "detect" and report["max_abs_diff"] <= 1e-4 and report["checked_images"] >= 3
    runner = OnnxRunner(out)
    assert runner.detects and runner.class_names == vitkit.load_model(run).class_names
    # the ONNX file through predict: the same boxes as PyTorch on real images and a blank one
    from vitkit.inference import detect_files, load_detector

    want = detect_files(load_detector(str(sparse)), images)[0]
    assert cli(["predict", str(out), *map(str, images), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["predictions"]
    assert len({len(p["boxes"]) for p in want}) > 1, "the images give different numbers of boxes"
    for a, b in zip(got, want):
        assert [x["index"] for x in a["boxes"]] == [x["index"] for x in b["boxes"]]
        assert [x["score"] for x in a["boxes"]] == pytest.approx([x["score"] for x in b["boxes"]], abs=1e-4)
        assert [x["box"] for x in a["boxes"]] == [pytest.approx(x["box"], abs=1e-2) for x in b["boxes"]]
    # vitkit eval scores the run, not its export; what a detector does not export to: one line each
    assert cli(["eval", str(out)]) == 2
    assert "exported detector" in _one_error_line(capsys)
    assert cli(["export", str(sparse), "--onnx", str(tmp_path / "x.onnx"), "--int8"]) == 2
    line = _one_error_line(capsys)
    assert "--int8" in line and "detector" in line
