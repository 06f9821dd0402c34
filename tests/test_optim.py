"""Optimiser groups: layer-wise LR decay derived from `group_matcher()` equals timm's
`param_groups_layer_decay` on the same model, and works for a model without `blocks`."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import vitkit
from vitkit.training.optim import group_ids, lr_factor, param_groups
from vitkit.training.recipes import Recipe

DECAY = 0.75


def _ours(model: nn.Module, **recipe) -> dict[str, tuple[float, float]]:
    """name -> (lr multiplier, weight decay) from vitkit's groups."""
    r = Recipe(lr=1e-3, layer_decay=DECAY, weight_decay=0.05, **recipe)
    out = {}
    for g in param_groups(model, r):
        assert g["lr"] == g["base_lr"]
        for name in g["names"]:
            out[name] = (g["base_lr"] / r.lr, g["weight_decay"])
    return out


def _timm(model: nn.Module) -> dict[str, tuple[float, float]]:
    from timm.optim._param_groups import param_groups_layer_decay

    by_id = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=DECAY,
                                      no_weight_decay_list=list(model.no_weight_decay()))
    return {by_id[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}


def test_vit_layer_decay_equals_timm():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=3, img_size=32, num_classes=5, class_token=True)
    ours, ref = _ours(model), _timm(model)
    assert ours.keys() == ref.keys() == {n for n, _ in model.named_parameters()}
    for name in ref:
        assert ours[name][0] == pytest.approx(ref[name][0], rel=1e-12), name
        assert ours[name][1] == ref[name][1], name
    depth = 3  # groups: stem, 3 blocks (the final norm joins the last), head
    assert ours["pos_embed"] == (DECAY ** (depth + 1), 0.0) and ours["cls_token"][1] == 0.0
    assert ours["patch_embed.proj.weight"] == (pytest.approx(DECAY ** (depth + 1)), 0.05)
    assert ours["blocks.0.attn.qkv.weight"][0] == pytest.approx(DECAY ** depth)
    assert ours["norm.weight"][0] == pytest.approx(DECAY) == ours["blocks.2.mlp.fc1.weight"][0]
    assert ours["head.weight"] == (1.0, 0.05) and ours["head.bias"] == (1.0, 0.0)
    assert len({round(s, 12) for s, _ in ours.values()}) == depth + 2


def test_pico_vit_layer_decay_equals_timm():
    model = vitkit.create_model("vit_pico_patch2_8")
    ours, ref = _ours(model), _timm(model)
    assert {n: s for n, (s, _) in ours.items()} == pytest.approx({n: s for n, (s, _) in ref.items()}, rel=1e-12)
    assert min(s for s, _ in ours.values()) < 1.0  # decay did happen


def test_resnet_layer_decay_equals_timm():
    model = vitkit.create_model("resnet18", num_classes=10)
    ours, ref = _ours(model), _timm(model)
    assert ours.keys() == ref.keys()
    for name in ref:
        assert ours[name] == (pytest.approx(ref[name][0], rel=1e-12), ref[name][1]), name
    # stem, 8 residual blocks, fc: 10 groups
    assert ours["conv1.weight"][0] == pytest.approx(DECAY ** 9) and ours["fc.weight"][0] == 1.0
    assert ours["layer4.1.conv2.weight"][0] == pytest.approx(DECAY)


class TinyCNN(nn.Module):
    """No `blocks`, no `layer_id`: only a group matcher, as a ResNet or Swin has."""

    head_names = ("classifier",)

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3)
        self.stages = nn.Sequential(nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3))
        self.norm = nn.BatchNorm2d(4)
        self.classifier = nn.Linear(4, 10)

    def group_matcher(self, coarse: bool = False) -> dict:
        return {"stem": r"^stem", "blocks": [(r"^stages\.(\d+)", None), (r"^norm", (99999,))]}

    def no_weight_decay(self) -> set[str]:
        return set()


def test_layer_decay_for_a_model_without_blocks():
    model = TinyCNN()
    assert not hasattr(model, "blocks") and not hasattr(model, "layer_id")
    ours, ref = _ours(model), _timm(model)
    for name in ref:
        assert ours[name] == (pytest.approx(ref[name][0], rel=1e-12), ref[name][1]), name
    d = DECAY
    assert ours["stem.weight"][0] == pytest.approx(d ** 3)
    assert ours["stages.0.weight"][0] == pytest.approx(d ** 2)
    assert ours["stages.1.weight"][0] == pytest.approx(d) == ours["norm.weight"][0]  # 99999: merged
    assert ours["classifier.weight"] == (1.0, 0.05)  # unmatched: the last group
    # head_lr reaches the module the model names as its head, whatever it is called
    with_head = _ours(model, head_lr=0.1)
    assert with_head["classifier.weight"][0] == pytest.approx(100.0) and with_head["classifier.bias"][0] == pytest.approx(100.0)
    assert with_head["stem.weight"][0] == pytest.approx(d ** 3)


def test_no_layer_decay_means_one_lr_and_the_usual_decay_rules():
    model = vitkit.create_model("vit_pico_patch2_8")
    groups = param_groups(model, Recipe(lr=2e-3, weight_decay=0.05))
    assert {g["base_lr"] for g in groups} == {2e-3} and len(groups) == 2
    nd = {n for g in groups if g["weight_decay"] == 0.0 for n in g["names"]}
    assert all(n.endswith(".bias") or "norm" in n or n in model.no_weight_decay() or "pos_embed" in n
               or n.endswith("token") for n in nd)
    assert "blocks.0.attn.qkv.weight" not in nd


def test_group_ids_follow_timm_on_ordinals():
    from timm.models._manipulate import group_with_matcher

    names = ["stem.w", "stages.10.w", "stages.2.w", "stages.2.b", "final.w", "head.w"]
    matcher = {"stem": r"^stem", "blocks": [(r"^stages\.(\d+)", None), (r"^final", (99999,))]}
    ref = group_with_matcher(((n, None) for n in names), matcher, reverse=True)
    assert group_ids(names, matcher) == ref == {"stem.w": 0, "stages.2.w": 1, "stages.2.b": 1, "stages.10.w": 2,
                                                 "final.w": 2, "head.w": 3}


def test_lr_schedule_warmup_then_cosine():
    assert lr_factor(0, 100, 10, 0.0) == pytest.approx(0.1)
    assert lr_factor(9, 100, 10, 0.0) == pytest.approx(1.0)
    assert lr_factor(10, 100, 10, 0.0) == pytest.approx(1.0)
    assert lr_factor(55, 100, 10, 0.0) == pytest.approx(0.5)
    assert lr_factor(100, 100, 10, 0.01) == pytest.approx(0.01)
    assert torch.isfinite(torch.tensor(lr_factor(1000, 100, 10, 0.01)))
