"""The `mobilenet` family: torchvision's MobileNetV3 under torchvision's names and keys, equal to torchvision's own
builders, importing torchvision checkpoints by key signature, with the feature contract and the training path."""
from __future__ import annotations

import json

import pytest
import torch
import torchvision

import vitkit
from vitkit.cli.main import main as cli


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "mobilenet_v3_large"])
def test_registered_names_equal_torchvision(arch):
    torch.manual_seed(0)
    ours = vitkit.create_model(arch).eval()
    theirs = getattr(torchvision.models, arch)().eval()
    assert list(ours.state_dict()) == list(theirs.state_dict())  # torchvision's keys, in its order
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
        feats = ours.forward_head(ours.forward_features(x), pre_logits=True)
    assert feats.shape == (2, ours.num_features)  # the classifier's hidden layer, before its last Linear


@pytest.mark.parametrize("arch, classes, chans", [("mobilenet_v3_small", 7, 3), ("mobilenet_v3_large", 10, 1)])
def test_torchvision_checkpoints_import_by_key_signature(arch, classes, chans, tmp_path):
    torch.manual_seed(0)
    tv = getattr(torchvision.models, arch)(num_classes=classes).eval()
    if chans != 3:
        tv.features[0][0] = torch.nn.Conv2d(chans, 16, 3, stride=2, padding=1, bias=False)
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    model = vitkit.load_model(tmp_path / "tv.pth").eval()
    assert model.family == "mobilenet" and model.cfg.arch == arch and model.num_classes == classes
    assert model.provenance["imported_from"] == "torchvision-mobilenet-v3"
    x = torch.randn(2, chans, 96, 96)
    with torch.no_grad():
        torch.testing.assert_close(model(x), tv(x), rtol=0, atol=0)
    vitkit.save_model(model, tmp_path / "vk.safetensors")  # and back as a vitkit file
    again = vitkit.load_model(tmp_path / "vk.safetensors").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(x), tv(x), rtol=0, atol=0)


def test_feature_maps_follow_timms_strides():
    model = vitkit.create_model("mobilenet_v3_small", num_classes=0).eval()
    info = model.feature_info
    assert [f["reduction"] for f in info] == [2, 4, 8, 16, 32]
    assert [f["num_chs"] for f in info] == [16, 16, 24, 48, 576]  # timm's mobilenetv3_small_100 feature_info
    maps = model.forward_intermediates(torch.randn(1, 3, 64, 64), intermediates_only=True)
    assert [tuple(m.shape[1:]) for m in maps] == [(c, 64 // r, 64 // r) for c, r in
                                                  ((f["num_chs"], f["reduction"]) for f in info)]


def test_trains_through_the_recipes_on_digits(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["train", "--data", "digits", "--model", "mobilenet_v3_small", "--epochs", "1", "--out", str(run),
                "--quiet", "--set", "steps_per_epoch=3", "--set", "batch_size=16", "--set", "threads=1",
                "--set", "bf16=false", "--set", "eval_batch_size=512"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and 0 <= summary["final"]["top1"] <= 100
    model = vitkit.load_model(run / "best.safetensors")
    assert model.family == "mobilenet" and model.cfg.in_chans == 1 and model.num_classes == 10
