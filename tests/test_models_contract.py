"""The model contract, for every registered name (timm's tests/test_models.py style): full size on the meta
device; forward, backward, head reset, layer groups and a save/load round trip on a tiny override."""
from __future__ import annotations

import math

import pytest
import torch

import vitkit
from vitkit.models import FAMILIES, VitkitModel, get_entry, get_family
from vitkit.training.optim import group_ids

NAMES = vitkit.list_models()


def tiny_overrides(name: str) -> dict:
    """A few-thousand-parameter version of the entry that keeps its family, layout and options."""
    entry = get_entry(name)
    cfg = entry.cfg
    if entry.family == "vit":
        # width divisible by the blocks' heads and by an attention-pooling head's own count (Perception Encoder)
        return {"depth": 1, "embed_dim": 4 * math.lcm(cfg.num_heads, cfg.pool_num_heads or 1),
                "img_size": 2 * cfg.patch_size}
    if entry.family == "clip":  # both towers small; the image tower keeps its patch size and layout
        v = cfg.vision
        return {"vision": v.replace(depth=1, embed_dim=4 * v.num_heads, img_size=2 * v.patch_size), "embed_dim": 8,
                "text_layers": 1, "text_width": 4 * cfg.text_heads, "vocab_size": 64}
    if entry.family == "swin":  # one block per stage (the first keeps a shifted pair), width 8, window 2
        n = len(cfg.depths)
        return {"img_size": 32, "embed_dim": 8, "depths": (2,) + (1,) * (n - 1), "num_heads": (1,) * n, "window_size": 2}
    if entry.family in ("mae", "dino"):  # the ViT inside as small as the vit branch's; the decoder / head tiny
        vit = cfg.encoder if entry.family == "mae" else cfg.backbone
        small = {"depth": 1, "embed_dim": 4 * vit.num_heads, "img_size": 2 * vit.patch_size}
        return small | ({"decoder_dim": 8, "decoder_depth": 1, "decoder_heads": 2} if entry.family == "mae"
                        else {"out_dim": 8, "hidden_dim": 8, "bottleneck_dim": 4})
    return {"img_size": 16}


def test_every_family_and_name_is_registered():
    assert {"vit", "resnet"} <= set(FAMILIES)
    assert {get_entry(n).family for n in NAMES} == set(FAMILIES)
    assert len(vitkit.list_models(family="vit")) >= 86 and len(vitkit.list_models(family="resnet")) == 3


@pytest.mark.parametrize("name", NAMES)
def test_full_size_on_meta_declares_the_protocol(name):
    entry = get_entry(name)
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert isinstance(model, VitkitModel)
    assert model.family == entry.family and isinstance(model, get_family(entry.family).model)
    assert model.cfg == entry.cfg and model.num_classes == entry.cfg.num_classes
    assert model.preprocess.input_size == (entry.cfg.in_chans, *entry.cfg.img_size)
    assert len(model.preprocess.mean) == entry.cfg.in_chans
    assert model.class_names is None and model.provenance["arch"] == name
    names = {n for n, _ in model.named_parameters()}
    assert all(any(n == k or n.startswith(k + ".") for n in names) for k in model.no_weight_decay() & names)
    ids = group_ids(names, model.group_matcher())
    assert set(ids) == names and min(ids.values()) == 0
    heads = [n for n in names if n.split(".")[0] in model.head_names]
    if model.num_classes:
        assert heads and all(ids[n] == max(ids.values()) for n in heads)  # the head is the last group


@pytest.mark.parametrize("name", NAMES)
def test_tiny_forward_backward_reset_and_round_trip(name, tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model(name, **tiny_overrides(name))
    cfg = model.cfg
    x = torch.randn(2, cfg.in_chans, *cfg.img_size)
    model.train()
    feats = model.forward_features(x)
    pooled = model.forward_head(feats, pre_logits=True)
    assert pooled.shape == (2, model.num_features)
    out = model.forward_head(feats)
    assert out.shape == (2, model.num_classes or model.num_features)
    out.float().square().mean().backward()
    unused = {"mask_token"}  # only takes part when patches are masked
    if model.family == "clip":  # the text tower and temperature are not on the image path
        unused |= {n for n, _ in model.named_parameters() if n.startswith("text.")} | {"logit_scale"}
    if model.family in ("mae", "dino"):  # the decoder / the DINO head are not on the image path
        unused |= {n for n, _ in model.named_parameters() if not n.startswith(f"{model.image_attr}.")}
    for n, p in model.named_parameters():
        if p.requires_grad and n not in unused:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
    model.reset_classifier(5)
    assert model.num_classes == 5 and model.cfg.num_classes == 5
    model.eval()
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (2, 5)
    path = vitkit.save_model(model, tmp_path / "m.safetensors", class_names=list("abcde"))
    again = vitkit.load_model(path).eval()
    assert type(again) is type(model) and again.cfg == model.cfg and again.class_names == list("abcde")
    with torch.no_grad():
        assert torch.equal(again(x), logits)


def test_lists_by_family():
    assert vitkit.list_models(family="resnet") == ["resnet18", "resnet34", "resnet50"]
    assert "vit_base_patch16_224" in vitkit.list_models(family="vit")
    assert vitkit.list_models("resnet*", family="vit") == []
