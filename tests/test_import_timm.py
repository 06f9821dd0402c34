"""Parity with timm: checkpoints written by timm (safetensors / torch.save training dicts / timm hub folders)
load into vitkit with the architecture read off the file and by name, and give timm's outputs."""
from __future__ import annotations

import pytest
import timm  # a test dependency: parity needs the real peer
import torch
from safetensors.torch import save_file
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import checkpoint_filter_fn

import vitkit

# one tiny architecture: timm's constructor and vitkit's create_model overrides take the same keywords
TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 128, "depth": 2, "num_heads": 2, "num_classes": 10}
TOL = 1e-4


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere (biases, norms, LayerScale too), so a mis-mapped tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def reference(model, x):
    with torch.no_grad():
        return model(x), model.forward_head(model.forward_features(x), pre_logits=True)


def check(vk, x, ref, name, record):
    ref_logits, ref_feats = ref
    assert ref_logits.std() > 1e-3  # a degenerate peer output would prove nothing
    vk.eval()
    with torch.no_grad():
        lo = (vk(x) - ref_logits).abs().max().item()
        fe = (vk.forward_head(vk.forward_features(x), pre_logits=True) - ref_feats).abs().max().item()
    record(name, lo, fe)
    assert lo <= TOL and fe <= TOL, (name, lo, fe)


CONFIGS = {
    # name: (timm constructor kwargs, how it is saved, registered vitkit name, extra overrides)
    "plain": ({}, "safetensors", "vit_tiny_patch16_224", {}),
    "gap_fc_norm": ({"class_token": False, "global_pool": "avg"}, "train_dict", "vit_tiny_patch16_gap_224", {}),
    "mae_finetuned_cls_avg": ({"global_pool": "avg"}, "train_dict", "vit_tiny_patch16_224",
                              {"global_pool": "avg", "fc_norm": True}),
    "registers_layerscale": ({"reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5}, "safetensors",
                             "vit_small_patch14_reg4_dinov2", {}),
}


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_timm_parity(cfg, tmp_path, photo_batch, record_parity):
    kw, fmt, name, extra = CONFIGS[cfg]
    peer = perturb(TimmViT(**TINY, **kw))
    path = tmp_path / ("w.safetensors" if fmt == "safetensors" else "checkpoint.pth")
    if fmt == "safetensors":
        save_file(peer.state_dict(), str(path))
    else:  # DeiT / MAE fine-tuning scripts save {'model': state_dict, ...}
        torch.save({"model": peer.state_dict(), "epoch": 3}, path)
    x = photo_batch(32)
    ref = reference(peer, x)
    check(vitkit.load_model(path), x, ref, f"timm {cfg} (load_model)", record_parity)
    check(vitkit.create_model(name, checkpoint_path=path, **TINY, **extra), x, ref,
          f"timm {cfg} (create_model {name})", record_parity)


def test_timm_deit_distilled(tmp_path, photo_batch, record_parity):
    peer = perturb(VisionTransformerDistilled(**TINY))
    path = tmp_path / "deit.pth"
    torch.save({"model": peer.state_dict()}, path)
    x = photo_batch(32)
    ref = reference(peer, x)
    vk = vitkit.load_model(path)
    assert vk.cfg.distilled and vk.head_dist is not None
    check(vk, x, ref, "timm DeiT distilled (load_model)", record_parity)
    check(vitkit.create_model("deit_tiny_distilled_patch16_224", checkpoint_path=path, **TINY), x, ref,
          "timm DeiT distilled (create_model)", record_parity)


def test_timm_clip_quickgelu(tmp_path, photo_batch, record_parity):
    """timm's CLIP tower config (pre-norm, bias-free patch conv, QuickGELU, eps 1e-5) at tiny width."""
    peer = perturb(timm.create_model("vit_base_patch32_clip_quickgelu_224", **TINY))
    assert peer.patch_embed.proj.bias is None
    folder = tmp_path / "hub"
    timm.models.save_for_hf(peer, str(folder), safe_serialization=True)  # a timm hub folder: config.json + weights
    x = photo_batch(32)
    ref = reference(peer, x)
    vk = vitkit.load_model(folder)  # config.json's architecture says QuickGELU
    assert (vk.cfg.act, vk.cfg.norm_eps, vk.cfg.pre_norm, vk.cfg.patch_bias) == ("quick_gelu", 1e-5, True, False)
    check(vk, x, ref, "timm CLIP quickgelu hub folder (load_model)", record_parity)
    # a bare weights file cannot tell QuickGELU from GELU: say it
    bare = folder / "model.safetensors"
    check(vitkit.load_model(bare, act="quick_gelu"), x, ref, "timm CLIP quickgelu file (load_model act=)",
          record_parity)
    with torch.no_grad():  # and the comparison is sharp enough to see the activation
        assert (vitkit.load_model(bare).eval()(x) - ref[0]).abs().max() > 10 * TOL
    check(vitkit.create_model("vit_base_patch32_clip_quickgelu_224", checkpoint_path=bare, **TINY), x, ref,
          "timm CLIP quickgelu (create_model)", record_parity)


@pytest.mark.parametrize("kw", [{}, {"reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5}],
                         ids=["cls_pos", "registers_no_embed_class"])
def test_resolution_change_matches_timm_resample(kw, tmp_path, photo_batch, record_parity):
    """A 384 checkpoint used at 224: vitkit's load-time resample == timm's checkpoint_filter_fn
    (resample_abs_pos_embed, bicubic + antialias)."""
    big = dict(TINY, img_size=384, patch_size=32)
    src = perturb(TimmViT(**big, **kw))
    path = tmp_path / "w384.safetensors"
    save_file(src.state_dict(), str(path))
    peer = TimmViT(**dict(big, img_size=224), **kw).eval()
    peer.load_state_dict(checkpoint_filter_fn(src.state_dict(), peer))
    x = photo_batch(224)
    ref = reference(peer, x)
    vk = vitkit.load_model(path, img_size=224)
    assert vk.patch_embed.grid_size == (7, 7)
    check(vk, x, ref, f"timm 384->224 resample {'+'.join(kw) or 'cls'} (load_model)", record_parity)
    name = "vit_small_patch14_reg4_dinov2" if kw else "vit_tiny_patch16_224"
    by_name = dict(TINY, patch_size=32, img_size=224)
    check(vitkit.create_model(name, checkpoint_path=path, **by_name), x, ref,
          f"timm 384->224 resample {'+'.join(kw) or 'cls'} (create_model)", record_parity)
