"""Dense prediction: ViTDet's simple feature pyramid, the segmentation head on ViT / Swin / ResNet backbones, the
canvas datasets built from real digits and Fashion-MNIST, mIoU against scikit-learn, and `task=segment`
through the real training loop."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.data.canvas import SPECS, CanvasSpec, paste_canvases
from vitkit.data.datasets import load_data
from vitkit.errors import ConfigError
from vitkit.layers.pyramid import SimpleFeaturePyramid, scales_for
from vitkit.models.segmentation import SegmentationHead, Segmenter, backbone_maps
from vitkit.models.swin import SwinConfig, SwinTransformer
from vitkit.training.recipes import Recipe
from vitkit.training.tasks.segment import confusion_matrix, iou_metrics
from vitkit.training.trainer import Trainer


@pytest.fixture(scope="module")
def digits_canvas():
    return load_data("canvas-digits")


def test_simple_feature_pyramid_gives_strides_4_to_32_from_a_stride_16_map():
    sfp = SimpleFeaturePyramid(64, out_dim=32)
    x = torch.randn(2, 64, 14, 14)  # a ViT-B/16-like map of a 224 px image
    outs = sfp(x)
    assert [tuple(o.shape) for o in outs] == [(2, 32, 56, 56), (2, 32, 28, 28), (2, 32, 14, 14), (2, 32, 7, 7)]
    # ViTDet: 4x is two 2x2/2 deconvolutions (to dim/4), 2x one (dim/2), 1x nothing, 0.5x a max-pool
    deconv = [[m for m in r.modules() if isinstance(m, torch.nn.ConvTranspose2d)] for r in sfp.resample]
    assert [[(m.in_channels, m.out_channels) for m in d] for d in deconv] == [[(64, 32), (32, 16)], [(64, 32)], [], []]
    # a 2x2/2 deconvolution writes each input pixel into its own 2x2 block: a change at (3, 5) stays in rows
    # 6-7, columns 10-11 of the 2x map before the 3x3 convolution
    y = x.clone()
    y[:, :, 3, 5] += 1.0
    with torch.no_grad():
        diff = (sfp.resample[1](y) - sfp.resample[1](x)).abs().sum(dim=(0, 1))
    assert diff[6:8, 10:12].min() > 0
    diff[6:8, 10:12] = 0
    assert not diff.any()
    with pytest.raises(ValueError):
        SimpleFeaturePyramid(30)  # the 4x level halves the width twice
    # a patch-4 ViT's map is already at stride 4: the same strides need scales 1, 1/2, 1/4, 1/8
    assert scales_for(4) == (1.0, 0.5, 0.25, 0.125) and scales_for(16) == (4.0, 2.0, 1.0, 0.5)
    small = SimpleFeaturePyramid(32, out_dim=8, scales=scales_for(4))
    assert [o.shape[-1] for o in small(torch.randn(1, 32, 8, 8))] == [8, 4, 2, 1]


BACKBONES = {
    "vit": lambda: vitkit.create_model("vit_tiny_patch4_28", img_size=32, depth=2, embed_dim=32, num_heads=2,
                                       in_chans=1, num_classes=11),
    "swin": lambda: SwinTransformer(SwinConfig(img_size=32, in_chans=1, embed_dim=16, depths=(1, 1, 1, 1),
                                               num_heads=(1, 2, 2, 4), window_size=4, num_classes=11)),
    "resnet": lambda: vitkit.create_model("resnet18", in_chans=1, num_classes=11),
    # a hybrid is a ViT whose patches come from a conv stem: the plain path, at its pixel stride (4)
    "hybrid": lambda: vitkit.create_model("vit_tiny_conv_32", depth=1, embed_dim=32, num_heads=2, in_chans=1,
                                          num_classes=11),
}


@pytest.mark.parametrize("family", list(BACKBONES))
def test_segmenter_on_every_family_gives_per_pixel_logits_and_trains_end_to_end(family, digits_canvas):
    backbone = BACKBONES[family]()
    seg = Segmenter(backbone, num_classes=11, dim=16)
    images = torch.stack([digits_canvas.train[i][0] for i in range(4)]).float() / 255  # [4, 1, 32, 32]
    masks = torch.stack([digits_canvas.train[i][1] for i in range(4)])
    maps = backbone_maps(backbone, images)
    assert len(maps) == (1 if family in ("vit", "hybrid") else 4)  # a plain ViT: one map; the others a pyramid
    logits = seg(images)
    assert logits.shape == (4, 11, 32, 32)
    loss = torch.nn.functional.cross_entropy(logits, masks)
    loss.backward()
    first_backbone = next(p for p in backbone.parameters() if p.requires_grad)
    assert first_backbone.grad is not None and first_backbone.grad.abs().sum() > 0
    assert seg.head.classifier.weight.grad.abs().sum() > 0


def test_swin_pyramid_is_its_stage_maps():
    model = BACKBONES["swin"]().eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        maps = backbone_maps(model, x)
        final = model.forward_features(x)  # NHWC, normed
    assert [m.shape[-1] for m in maps] == [8, 4, 2, 1]
    assert [e["reduction"] for e in model.feature_info] == [4, 8, 16, 32]
    assert torch.allclose(maps[-1], final.permute(0, 3, 1, 2), atol=1e-6)  # the last one as the classifier sees it


def test_resnet_pyramid_is_layer1_to_layer4_without_the_stem():
    """A ResNet gives five maps (timm's: the stem, then layer1..4); the head reads the deepest at each stride."""
    for small_stem, strides in ((True, [1, 2, 4, 8]), (False, [4, 8, 16, 32])):
        model = vitkit.create_model("resnet18", in_chans=1, num_classes=3, small_stem=small_stem).eval()
        x = torch.randn(1, 1, 32, 32)
        with torch.no_grad():
            maps = backbone_maps(model, x)
        assert len(model.feature_info) == 5 and [32 // m.shape[-1] for m in maps] == strides
        assert [m.shape[1] for m in maps] == [64, 128, 256, 512]


def test_head_refuses_what_it_cannot_use():
    with pytest.raises(ConfigError, match="forward_intermediates"):
        SegmentationHead.for_backbone(torch.nn.Linear(2, 2), 3)
    with pytest.raises(ConfigError):
        SegmentationHead([8, 16], 3, plain=True)


def test_canvas_is_reproducible_and_its_masks_follow_the_pasted_items(digits_canvas):
    spec = SPECS["canvas-digits"]
    src = load_data("digits")
    a = paste_canvases(src.train.images[:50], src.train.labels[:50], 20, spec, seed=3)
    b = paste_canvases(src.train.images[:50], src.train.labels[:50], 20, spec, seed=3)
    c = paste_canvases(src.train.images[:50], src.train.labels[:50], 20, spec, seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.masks, b.masks) and not torch.equal(a.masks, c.masks)
    ds = digits_canvas.train
    assert digits_canvas.class_names[0] == "background" and len(digits_canvas.class_names) == 11
    assert ds.images.shape[1:] == (1, 32, 32) and ds.masks.shape[1:] == (32, 32)
    item = ds.masks > 0
    # labelled pixels are the bright pixels of an item; background is only faint noise
    assert (ds.images[:, 0][item] > spec.threshold).all() and (ds.images[:, 0][~item] <= spec.threshold).all()
    assert set(torch.unique(ds.masks).tolist()) == set(range(11))
    # one pasted item, no noise: the mask is exactly the item's class where it is bright
    one = CanvasSpec("digits", 16, (1.0, 1.0), (1, 1), 1, 1, threshold=64, noise=0)
    single = paste_canvases(src.train.images[:1], src.train.labels[:1], 1, one, seed=0)
    bright = single.images[0, 0] > 64
    assert torch.equal(single.masks[0] > 0, bright) and set(single.masks[0][bright].tolist()) == \
        {int(src.train.labels[0]) + 1}


def test_iou_metrics_match_scikit_learn():
    from sklearn.metrics import accuracy_score, jaccard_score

    g = torch.Generator().manual_seed(0)
    true = torch.randint(0, 5, (3, 20, 20), generator=g)
    pred = torch.where(torch.rand(3, 20, 20, generator=g) < 0.6, true, torch.randint(0, 5, (3, 20, 20), generator=g))
    pred[pred == 4] = 3  # class 4 never predicted: IoU 0, still counted (it occurs in the truth)
    m = iou_metrics(confusion_matrix(pred, true, 6))  # class 5 occurs nowhere: left out
    ref = jaccard_score(true.flatten().numpy(), pred.flatten().numpy(), average=None, labels=list(range(5)))
    assert m["miou"] == pytest.approx(100 * ref.mean()) and m["miou_fg"] == pytest.approx(100 * ref[1:].mean())
    assert m["pixel_acc"] == pytest.approx(100 * accuracy_score(true.flatten(), pred.flatten()))
    assert np.allclose(m["iou_per_class"][:5], 100 * ref, atol=0.01) and m["iou_per_class"][4] == 0


def _recipe(**kw) -> Recipe:
    base = dict(task="segment", data="canvas-digits", model="vit_tiny_patch4_28", img_size=32, in_chans=1,
                model_args={"depth": 2, "embed_dim": 48, "num_heads": 3}, epochs=2, steps_per_epoch=6,
                batch_size=32, lr=2e-3, warmup_epochs=0, crop="none", threads=1, bf16=False, ema=False,
                eval_batch_size=200, task_args={"dim": 32, "overlays": 2})
    return Recipe(**(base | kw))


def test_segment_task_trains_and_reports_miou_with_figures(tmp_path):
    summary = Trainer(_recipe(), tmp_path / "run", quiet=True).run()
    run = tmp_path / "run"
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert history[1]["train_loss"] < history[0]["train_loss"]  # it learns
    final = summary["final"]
    assert final["split"] == "test" and 0 < final["miou"] <= 100 and final["pixel_acc"] > 50
    report = (run / "report.md").read_text()
    assert "miou" in report and "overlays.png" in report and (run / "overlays.png").stat().st_size > 0
    assert (run / "confusion.png").exists()
    # the saved backbone and head reproduce the reported test mIoU
    backbone = vitkit.load_model(run / "last.safetensors").eval()
    head = SegmentationHead.for_backbone(backbone, 11, 32).eval()
    head.load_state_dict(load_file(run / "segmentation_head.safetensors"))
    test = load_data("canvas-digits").test
    pre = backbone.preprocess
    x = (torch.stack([test[i][0] for i in range(len(test))]).float() / 255 - pre.mean[0]) / pre.std[0]
    with torch.no_grad():
        pred = head(backbone_maps(backbone, x), x.shape[-2:]).argmax(1)
    m = iou_metrics(confusion_matrix(pred, test.masks.long(), 11))
    assert m["miou"] == pytest.approx(final["miou"], abs=1e-3)


def test_segment_task_refuses_geometry_it_cannot_follow_and_data_without_masks(tmp_path):
    with pytest.raises(ConfigError, match="crop=rrc"):
        Trainer(_recipe(crop="rrc"), tmp_path / "a", quiet=True).run()
    with pytest.raises(ConfigError, match="hflip"):
        Trainer(_recipe(hflip=0.5), tmp_path / "b", quiet=True).run()
    with pytest.raises(ConfigError, match="per-pixel masks"):
        Trainer(_recipe(data="digits", img_size=8, model_args={"depth": 1, "embed_dim": 16, "num_heads": 1,
                                                               "patch_size": 2}), tmp_path / "c", quiet=True).run()


def test_segment_run_resumes_to_the_same_result(tmp_path):
    """The head is task state: a run stopped after epoch 1 and resumed ends where an uninterrupted one does."""
    recipe = _recipe(model_args={"depth": 1, "embed_dim": 32, "num_heads": 2}, steps_per_epoch=3,
                     task_args={"dim": 16, "overlays": 0})
    Trainer(recipe, tmp_path / "a", quiet=True, stop_after_epochs=1).run()
    resumed = Trainer(recipe, tmp_path / "a", resume=True, quiet=True).run()
    straight = Trainer(recipe, tmp_path / "b", quiet=True).run()
    assert resumed["final"] == straight["final"]
    assert torch.equal(load_file(tmp_path / "a" / "segmentation_head.safetensors")["classifier.weight"],
                       load_file(tmp_path / "b" / "segmentation_head.safetensors")["classifier.weight"])


def test_cli_task_flag_trains_a_segmenter_and_eval_refuses_its_masks(tmp_path, capsys):
    from vitkit.cli.main import main

    out = tmp_path / "run"
    rc = main(["train", "--task", "segment", "--data", "canvas-digits", "--model", "vit_tiny_patch4_28", "--epochs", "1",
               "--out", str(out), "--quiet", "--set", "img_size=32", "--set", "in_chans=1", "--set", "steps_per_epoch=2",
               "--set", "model.depth=1", "--set", "model.embed_dim=32", "--set", "model.num_heads=2",
               "--set", "task.dim=16", "--set", "task.overlays=0", "--set", "threads=1", "--set", "ema=false"])
    assert rc == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["recipe"]["task"] == "segment" and (out / "segmentation_head.safetensors").exists()
    capsys.readouterr()
    assert main(["eval", str(out / "last.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "segmentation dataset" in err and len(err.strip().splitlines()) == 1
