"""Detection: torchvision's detectors over the feature contract of a ViT, a Swin and a ResNet; COCO-format
annotation files read with pycocotools (and refused or cleaned in one line); the `canvas-digits-boxes` set;
COCO mAP equal to pycocotools' COCOeval run on a predictions file; `vitkit train --task detect`."""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli
from vitkit.data.canvas import BOX_SPECS, paste_canvases
from vitkit.data.datasets import load_data
from vitkit.errors import DataError
from vitkit.models.detection import Detector
from vitkit.models.swin import SwinConfig, SwinTransformer
from vitkit.training.recipes import Recipe
from vitkit.training.tasks.detect import DetectTask, coco_metrics, coco_results, eval_box_map, to_image_pixels

pytest.importorskip("pycocotools")

BACKBONES = {
    "vit": lambda: vitkit.create_model("vit_tiny_patch4_28", img_size=32, depth=1, embed_dim=32, num_heads=2,
                                       in_chans=1, num_classes=4),
    "swin": lambda: SwinTransformer(SwinConfig(img_size=32, in_chans=1, embed_dim=16, depths=(1, 1, 1, 1),
                                               num_heads=(1, 2, 2, 4), window_size=4, num_classes=4)),
    "resnet": lambda: vitkit.create_model("resnet18", in_chans=1, num_classes=4),
}
TARGETS = [{"boxes": torch.tensor([[2.0, 3.0, 20.0, 25.0], [10.0, 8.0, 30.0, 30.0]]), "labels": torch.tensor([1, 3])},
           {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}]


@pytest.mark.parametrize("family,kind", [("vit", "fcos"), ("swin", "fcos"), ("resnet", "fcos"),
                                         ("vit", "faster_rcnn")])
def test_detector_on_every_family_trains_and_predicts_torchvision_boxes(family, kind):
    torch.manual_seed(0)
    backbone = BACKBONES[family]()
    det = Detector(backbone, num_classes=4, kind=kind, dim=32)
    # the trunk is the backbone's, held once: its weights are not the detector's too
    trunk = {id(p) for p in backbone.parameters()}
    assert not any(id(p) in trunk for p in det.detector.parameters())
    assert sum(p.numel() for p in det.parameters()) == sum(p.numel() for p in backbone.parameters()) + \
        sum(p.numel() for p in det.detector.parameters())
    x = torch.randn(2, 1, 32, 32)
    det.train()
    losses = det(x, TARGETS)
    assert losses and all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in backbone.parameters())
    det.eval()
    with torch.no_grad():
        out = det(x)
    assert len(out) == 2
    for o in out:
        n = len(o["boxes"])
        assert o["boxes"].shape == (n, 4) and o["scores"].shape == (n,) and o["labels"].shape == (n,)
        if n:
            assert (o["labels"] >= 1).all() and (o["labels"] <= 3).all()
            assert (o["boxes"][:, 2:] >= o["boxes"][:, :2]).all() and o["boxes"].max() <= 32


@pytest.mark.parametrize("family", ["vit", "swin", "resnet"])
def test_a_32_wide_fcos_predicts_and_trains_on_one_image(family):
    """At task.dim=32 torchvision's GroupNorm(32, 32) keeps one channel per group; on a 32 px image the top
    level is 1x1, one value per group, which GroupNorm refuses: a batch of one failed (predict on one image)."""
    torch.manual_seed(0)
    det = Detector(BACKBONES[family](), num_classes=4, kind="fcos", dim=32).eval()
    with torch.no_grad():
        out = det(torch.randn(1, 1, 32, 32))
    assert len(out) == 1 and out[0]["boxes"].shape[1] == 4
    det.train()
    losses = det(torch.randn(1, 1, 32, 32), TARGETS[:1])
    assert all(torch.isfinite(v) for v in losses.values())
    norms = [m for m in det.detector.head.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert norms and all(m.num_channels // m.num_groups == 2 for m in norms)
    wide = Detector(BACKBONES[family](), num_classes=4, kind="fcos", dim=64)  # torchvision's groups, unchanged
    assert all(m.num_groups == 32 for m in wide.detector.head.modules() if isinstance(m, torch.nn.GroupNorm))


def test_canvas_boxes_bound_the_visible_pixels_of_each_item():
    spec = BOX_SPECS["canvas-digits-boxes"]
    src = load_data("digits")
    a = paste_canvases(src.train.images[:60], src.train.labels[:60], 30, spec, seed=5)
    b = paste_canvases(src.train.images[:60], src.train.labels[:60], 30, spec, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a.boxes, b.boxes))
    for mask, boxes in zip(a.masks, a.boxes):
        covered = torch.zeros_like(mask, dtype=torch.bool)
        for x0, y0, x1, y1, c in boxes.tolist():
            region = mask[y0:y1, x0:x1]
            # tight: the class reaches every edge of its box
            hits = region == c
            assert hits[0].any() and hits[-1].any() and hits[:, 0].any() and hits[:, -1].any()
            covered[y0:y1, x0:x1] |= hits
        assert torch.equal(covered, mask > 0)  # every labelled pixel is in a box of its class


def test_eval_box_map_follows_the_eval_transform():
    """A bright rectangle of a 40x60 image, through the real eval transform (resize by crop_pct, centre crop):
    where it lands is where eval_box_map puts its box."""
    from vitkit.data.transforms import eval_transform

    model = BACKBONES["vit"]()
    pre = model.preprocess
    img = np.zeros((40, 60), dtype=np.uint8)
    x0, y0, x1, y1 = 22, 10, 40, 30
    img[y0:y1, x0:x1] = 255
    out = eval_transform(pre)(Image.fromarray(img))[0]  # [32, 32], normalised
    ys, xs = torch.nonzero(out > out.mean(), as_tuple=True)
    sy, sx, oy, ox = eval_box_map((40, 60), pre)
    assert (sy, sx) != (1.0, 1.0) and ox > 0  # the map is not trivial here
    assert abs(x0 * sx - ox - xs.min().item()) <= 1 and abs(x1 * sx - ox - (xs.max().item() + 1)) <= 1
    assert abs(y0 * sy - oy - ys.min().item()) <= 1 and abs(y1 * sy - oy - (ys.max().item() + 1)) <= 1
    # predictions found there go back to the rectangle in the image's own pixels (and are clipped to it)
    found = torch.tensor([[xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1],
                          [-10.0, -10.0, 40.0, 40.0]])
    back = to_image_pixels(found, (40, 60), pre)
    assert back[0].tolist() == pytest.approx([x0, y0, x1, y1], abs=1 / min(sx, sy))
    assert back[1, :2].tolist() == [0, 0] and back[1, 2] <= 60 and back[1, 3] <= 40


def _coco_file(root: Path, n: int = 8, *, size=(48, 56)) -> tuple[Path, dict]:
    """A real COCO-format file with PNG images beside it (in images/), made from digit canvases: category ids
    10, 20, ... and image ids 100, 103, ... (not 1..K, 1..N), sizes other than the model's."""
    spec = BOX_SPECS["canvas-digits-boxes"]
    src = load_data("digits")
    canv = paste_canvases(src.train.images[:100], src.train.labels[:100] % 3, n, spec, seed=1)
    (root / "images").mkdir(parents=True)
    images, anns = [], []
    for i in range(n):
        pil = Image.fromarray(canv.images[i, 0].numpy()).resize(size[::-1])
        sx, sy = size[1] / spec.size, size[0] / spec.size
        name = f"img{i}.png"
        pil.save(root / "images" / name)
        images.append({"id": 100 + 3 * i, "file_name": name, "height": size[0], "width": size[1]})
        for x0, y0, x1, y1, c in canv.boxes[i].tolist():
            anns.append({"id": len(anns) + 1, "image_id": 100 + 3 * i, "category_id": 10 * c,
                         "bbox": [x0 * sx, y0 * sy, (x1 - x0) * sx, (y1 - y0) * sy],
                         "area": (x1 - x0) * sx * (y1 - y0) * sy, "iscrowd": 0})
    data = {"images": images, "annotations": anns,
            "categories": [{"id": 10 * c, "name": f"digit{c - 1}"} for c in (1, 2, 3)]}
    path = root / "ann.json"
    path.write_text(json.dumps(data))
    return path, data


def _cocoeval(ann: Path, predictions: Path) -> list[float]:
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann))
        ev = COCOeval(gt, gt.loadRes(str(predictions)), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [100 * float(v) for v in ev.stats[:3]]


def _recipe(**kw) -> Recipe:
    base = dict(task="detect", data="canvas-digits-boxes", model="vit_tiny_patch4_28", img_size=48, in_chans=1,
                model_args={"depth": 1, "embed_dim": 32, "num_heads": 2}, epochs=1, steps_per_epoch=2,
                batch_size=8, lr=1e-3, warmup_epochs=0, crop="none", threads=1, bf16=False, ema=False,
                eval_batch_size=64, task_args={"dim": 32})
    return Recipe(**(base | kw))


def test_map_equals_cocoeval_on_the_predictions_file(tmp_path):
    from torch.utils.data import DataLoader

    from vitkit.data.datasets import Transformed
    from vitkit.data.transforms import eval_transform

    ann, data = _coco_file(tmp_path)
    bundle = load_data(str(ann), channels=1)
    assert bundle.class_names == ["background", "digit0", "digit1", "digit2"] and len(bundle.train) == 8
    model = vitkit.create_model("vit_tiny_patch4_28", img_size=48, in_chans=1, depth=1, embed_dim=32, num_heads=2,
                                num_classes=4)
    model.class_names = bundle.class_names
    torch.manual_seed(0)
    task = DetectTask(_recipe(task_args={"dim": 32, "score_thresh": 0.0}), model, num_classes=4,
                      device=torch.device("cpu")).eval()
    loader = DataLoader(Transformed(bundle.train, eval_transform(model.preprocess), deterministic=False),
                        batch_size=3)
    metrics = task.evaluate(model, loader)
    detections, _, _ = task.predictions(model, loader)
    results = coco_results(detections, bundle.train.category_ids)
    assert results and {r["category_id"] for r in results} <= {10, 20, 30}
    assert {r["image_id"] for r in results} <= {im["id"] for im in data["images"]}
    pred = tmp_path / "pred.json"
    pred.write_text(json.dumps(results))
    assert [metrics["map"], metrics["map_50"], metrics["map_75"]] == pytest.approx(_cocoeval(ann, pred), abs=1e-6)
    # and on detections that mostly hit (the truth, shifted, with a false one per image): a high mAP, still equal
    rng = np.random.default_rng(0)
    near = [{"image_id": a["image_id"], "category_id": a["category_id"], "score": float(rng.uniform(0.3, 1)),
             "bbox": [v + float(rng.normal(0, 1.0)) for v in a["bbox"]]} for a in data["annotations"]]
    near += [{"image_id": im["id"], "category_id": 20, "bbox": [0, 0, 5, 5], "score": 0.9} for im in data["images"]]
    pred.write_text(json.dumps(near))
    from vitkit.training.tasks.detect import coco_ground_truth, unpad

    targets = [unpad({k: v[None] for k, v in bundle.train[i][1].items()})[0] for i in range(len(bundle.train))]
    mine = coco_metrics(coco_ground_truth(targets, 4), near_as_labels(near), bundle.class_names)
    reference = _cocoeval(ann, pred)
    assert reference[1] > 50 and [mine["map"], mine["map_50"], mine["map_75"]] == pytest.approx(reference, abs=1e-6)
    assert set(mine["per_class"]) == {"digit0", "digit1", "digit2"}


def near_as_labels(results: list[dict]) -> list[dict]:
    """Results with the file's category ids (10, 20, 30) -> vitkit's labels 1..3."""
    return [r | {"category_id": r["category_id"] // 10} for r in results]


def test_bad_annotation_files_each_say_one_clear_line(tmp_path, caplog):
    ann, data = _coco_file(tmp_path, n=3)
    # a missing image: listed and skipped, or a stop with strict
    gone = data | {"images": data["images"] + [{"id": 999, "file_name": "nowhere.png", "height": 48, "width": 56}]}
    path = tmp_path / "missing.json"
    path.write_text(json.dumps(gone))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        bundle = load_data(str(path), channels=1)
    assert len(bundle.train) == 3 and bundle.info["num_skipped"] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "skipped 1 image(s)" in lines[0] and "nowhere.png" in lines[0]
    with pytest.raises(DataError, match="nowhere.png.*--strict"):
        load_data(str(path), channels=1, strict=True)
    # boxes reaching out of the image: clipped; zero-area and unknown categories: dropped; one line with counts
    caplog.clear()
    anns = [dict(a) for a in data["annotations"]]
    anns[0]["bbox"] = [-5.0, 40.0, 20.0, 30.0]  # left of x=0 and below y=48
    anns[1]["bbox"] = [10.0, 10.0, 0.0, 8.0]  # zero width
    anns[2]["category_id"] = 77
    path = tmp_path / "dirty.json"
    path.write_text(json.dumps(data | {"annotations": anns}))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        bundle = load_data(str(path), channels=1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "clipped 1 box(es)" in lines[0] and "dropped 1 box(es) of zero area" in lines[0] \
        and "dropped 1 box(es) with category ids not in 'categories' (77)" in lines[0]
    first = bundle.train.boxes[[im["id"] for im in data["images"]].index(anns[0]["image_id"])]
    assert [0.0, 40.0, 15.0, 48.0] in first.tolist()
    assert sum(len(b) for b in bundle.train.boxes) == len(anns) - 2
    # a file that is not COCO json, and one that is JSON but not COCO's: one DataError line
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="not a COCO annotation file \\(not JSON"):
        load_data(str(bad))
    bad.write_text(json.dumps({"images": []}))
    with pytest.raises(DataError, match="missing: annotations, categories"):
        load_data(str(bad))


def test_cli_refuses_a_file_that_is_not_coco_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli(["train", "--task", "detect", "--data", str(bad), "--out", str(tmp_path / "run"), "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a COCO annotation file" in err[0] and "Traceback" not in err[0]


def test_vitkit_train_task_detect_on_canvas_digits_boxes_writes_a_run_with_map(tmp_path, capsys, monkeypatch):
    # the built-in set's own generator and loader, fewer canvases (the test's time goes to the run, not to data)
    monkeypatch.setitem(BOX_SPECS, "canvas-digits-boxes", replace(BOX_SPECS["canvas-digits-boxes"], train=64, test=24))
    out = tmp_path / "run"
    args = ["train", "--task", "detect", "--data", "canvas-digits-boxes", "--model", "vit_tiny_patch4_28",
            "--epochs", "1", "--out", str(out), "--quiet", "--json",
            *[a for kv in ("img_size=48", "in_chans=1", "model.depth=1", "model.embed_dim=32", "model.num_heads=2",
                           "steps_per_epoch=2", "batch_size=8", "threads=1", "crop=none", "ema=false",
                           "eval_batch_size=200", "task.dim=32", "warmup_epochs=0") for a in ("--set", kv)]]
    assert cli(args) == 0
    summary = json.loads(capsys.readouterr().out)
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"eval_map", "eval_map_50", "eval_map_75", "eval_loss"} <= set(history[0])
    assert 0 <= summary["final"]["map"] <= 100 and summary["final"]["split"] == "test"
    assert json.loads((out / "config.json").read_text())["data"]["test"] == 24
    assert (out / "best.safetensors").exists() and (out / "detection_head.safetensors").exists()
    results = json.loads((out / "predictions.json").read_text())
    assert results and set(results[0]) == {"image_id", "category_id", "bbox", "score"}


def test_eval_refuses_a_detection_set_in_one_line(capsys):
    from vitkit.cli.main import main

    assert main(["eval", "bundled:fashion-mnist", "--data", "canvas-digits-boxes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "detection dataset" in err[0] and "task=detect" in err[0]


def test_detect_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    """The detector (neck and head) is task state: a run stopped after epoch 1 and resumed ends with the same
    metrics, backbone and head weights as an uninterrupted one."""
    from safetensors.torch import load_file

    from vitkit.training.trainer import Trainer

    monkeypatch.setitem(BOX_SPECS, "canvas-digits-boxes", replace(BOX_SPECS["canvas-digits-boxes"], train=64, test=16))
    recipe = Recipe(task="detect", data="canvas-digits-boxes", model="vit_tiny_patch4_28", img_size=48, in_chans=1,
                    model_args={"depth": 1, "embed_dim": 32, "num_heads": 2}, epochs=2, steps_per_epoch=2,
                    batch_size=8, lr=2e-3, warmup_epochs=0, crop="none", reprob=0, threads=1, bf16=False, ema=False,
                    eval_batch_size=200, task_args={"dim": 32})
    Trainer(recipe, tmp_path / "a", quiet=True, stop_after_epochs=1).run()
    resumed = Trainer(recipe, tmp_path / "a", resume=True, quiet=True).run()
    straight = Trainer(recipe, tmp_path / "b", quiet=True).run()
    assert resumed["final"] == straight["final"]
    for name in ("last.safetensors", "detection_head.safetensors"):
        a, b = (load_file(str(tmp_path / run / name)) for run in ("a", "b"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
