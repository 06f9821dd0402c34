"""Parity with the real peers' own formats: HF transformers folders (ViT, DeiT), torchvision, OpenAI CLIP,
JAX .npz (vit_jax, big_vision scanned), DINOv2 hub, DINO v1 and MAE training checkpoints.
Every peer is built locally with random weights; nothing is downloaded."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import timm  # a test dependency: parity needs the real peer
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import _load_weights, checkpoint_filter_fn

import vitkit
from test_import_timm import TINY, TOL, check, perturb, reference
from vitkit.weights.convert import to_vitkit
from vitkit.weights.importers.jax_npz import export_npz, to_jax_arrays


def _hf_tiny(**kw):
    return dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, image_size=32,
                patch_size=8, **kw)


# ----------------------------------------------------------------------------------------- HF transformers
def test_hf_vit_for_image_classification(tmp_path, photo_batch, record_parity):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = ["cat", "dog", "fox"]
    cfg = ViTConfig(**_hf_tiny(num_labels=3, id2label=dict(enumerate(labels)),
                               label2id={n: i for i, n in enumerate(labels)}))
    assert cfg.layer_norm_eps == 1e-12  # HF's default, unlike timm/JAX 1e-6: the importer must carry it
    peer = perturb(ViTForImageClassification(cfg))
    peer.save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    x = photo_batch(32)
    with torch.no_grad():
        ref = peer(pixel_values=x).logits, peer.vit(pixel_values=x).last_hidden_state[:, 0]
    vk = vitkit.load_model(tmp_path)
    assert (vk.cfg.num_heads, vk.cfg.norm_eps, vk.cfg.act) == (2, 1e-12, "gelu")
    assert vk.class_names == labels and vk.provenance["imported_from"] == "hf-vit"
    assert vk.preprocess.mean == (0.5, 0.5, 0.5) and vk.preprocess.interpolation == "bilinear"
    assert vk.preprocess.crop_pct == 1.0
    check(vk, x, ref, "HF ViTForImageClassification (load_model)", record_parity)
    check(vitkit.create_model("vit_tiny_patch16_224", checkpoint_path=tmp_path, **dict(TINY, num_classes=3),
                              norm_eps=1e-12), x, ref, "HF ViTForImageClassification (create_model)", record_parity)


def test_hf_vit_model_bare_with_pooler(tmp_path, photo_batch, record_parity):
    from transformers import ViTConfig, ViTModel

    peer = perturb(ViTModel(ViTConfig(**_hf_tiny(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6))))
    peer.save_pretrained(tmp_path)
    imported = to_vitkit(dict(peer.state_dict()), {"num_attention_heads": 2})
    assert "pooler.dense.weight" in imported.dropped and not any(k.startswith("vit.") for k in imported.state_dict)
    x = photo_batch(32)
    with torch.no_grad():
        feats = peer(pixel_values=x).last_hidden_state[:, 0]
    vk = vitkit.load_model(tmp_path)
    assert vk.num_classes == 0 and vk.cfg.act == "gelu_tanh"
    check(vk, x, (feats, feats), "HF ViTModel (no prefix, pooler dropped)", record_parity)


def test_hf_deit_distilled(tmp_path, photo_batch, record_parity):
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    peer = perturb(DeiTForImageClassificationWithTeacher(DeiTConfig(**_hf_tiny(num_labels=10))))
    peer.save_pretrained(tmp_path)
    x = photo_batch(32)
    with torch.no_grad():
        h = peer.deit(pixel_values=x).last_hidden_state
        ref = peer(pixel_values=x).logits, (h[:, 0] + h[:, 1]) / 2
    vk = vitkit.load_model(tmp_path)
    assert vk.cfg.distilled and vk.provenance["imported_from"] == "hf-deit"
    assert vk.preprocess.crop_pct == 0.875 and vk.preprocess.interpolation == "bicubic"
    check(vk, x, ref, "HF DeiTForImageClassificationWithTeacher (load_model)", record_parity)
    check(vitkit.create_model("deit_tiny_distilled_patch16_224", checkpoint_path=tmp_path, **TINY, norm_eps=1e-12),
          x, ref, "HF DeiT distilled (create_model)", record_parity)


# ----------------------------------------------------------------------------------------- torchvision
def test_torchvision_vit(tmp_path, photo_batch, record_parity):
    from torchvision.models import VisionTransformer as TvViT

    peer = perturb(TvViT(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=128, mlp_dim=512,
                         num_classes=10))
    path = tmp_path / "vit_tv.pth"
    torch.save(peer.state_dict(), path)
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    with torch.no_grad():
        tokens = peer._process_input(x)  # [B, N, D]
        tokens = torch.cat([peer.class_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        ref = peer(x), peer.encoder(tokens)[:, 0]
    vk = vitkit.load_model(path)
    assert vk.provenance["imported_from"] == "torchvision" and vk.preprocess.interpolation == "bilinear"
    check(vk, x, ref, "torchvision VisionTransformer (load_model)", record_parity)
    check(vitkit.create_model("vit_tiny_patch16_224", checkpoint_path=path, **TINY), x, ref,
          "torchvision VisionTransformer (create_model)", record_parity)


# ----------------------------------------------------------------------------------------- OpenAI CLIP
def to_openai_clip(sd: dict, width_text: int = 32) -> dict:
    """timm CLIP-tower names -> OpenAI CLIP names (the documented mapping, inverted), plus a text tower."""
    out = {"visual.conv1.weight": sd["patch_embed.proj.weight"], "visual.class_embedding": sd["cls_token"][0, 0],
           "visual.positional_embedding": sd["pos_embed"][0], "visual.proj": sd["head.weight"].t().contiguous()}
    for ours, theirs in (("norm_pre", "ln_pre"), ("norm", "ln_post")):
        for kind in ("weight", "bias"):
            out[f"visual.{theirs}.{kind}"] = sd[f"{ours}.{kind}"]
    ren = {"norm1": "ln_1", "norm2": "ln_2", "attn.qkv.weight": "attn.in_proj_weight",
           "attn.qkv.bias": "attn.in_proj_bias", "attn.proj": "attn.out_proj", "mlp.fc1": "mlp.c_fc",
           "mlp.fc2": "mlp.c_proj"}
    for k, v in sd.items():
        if k.startswith("blocks."):
            _, i, rest = k.split(".", 2)
            for a, b in ren.items():
                if rest.startswith(a):
                    rest = b + rest[len(a):]
                    break
            out[f"visual.transformer.resblocks.{i}.{rest}"] = v
    g = torch.Generator().manual_seed(1)
    W = width_text  # the text tower shares key names with the image blocks: it must be ignored
    out |= {"token_embedding.weight": torch.randn(100, W, generator=g), "positional_embedding": torch.randn(77, W),
            "transformer.resblocks.0.ln_1.weight": torch.ones(W), "transformer.resblocks.0.attn.in_proj_weight":
            torch.randn(3 * W, W), "ln_final.weight": torch.ones(W), "text_projection": torch.randn(W, 16),
            "logit_scale": torch.tensor(4.6)}
    return out


def test_openai_clip_visual(tmp_path, photo_batch, record_parity):
    peer = perturb(timm.create_model("vit_base_patch32_clip_quickgelu_224", **dict(TINY, num_classes=16)))
    with torch.no_grad():
        peer.head.bias.zero_()  # CLIP's projection has no bias
    clip_sd = to_openai_clip(peer.state_dict())
    # the writer agrees with timm's own OpenAI-CLIP reader
    twin = timm.create_model("vit_base_patch32_clip_quickgelu_224", **dict(TINY, num_classes=16)).eval()
    twin.load_state_dict(checkpoint_filter_fn(dict(clip_sd), twin))
    x = photo_batch(32, mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))
    ref = reference(peer, x)
    assert torch.equal(twin(x), ref[0])
    plain = tmp_path / "open_clip_pytorch_model.bin"
    torch.save(clip_sd, plain)
    vk = vitkit.load_model(plain, tower="image")  # the pair's image tower (the whole pair: test_load_whole.py)
    assert (vk.cfg.act, vk.cfg.norm_eps, vk.cfg.num_heads, vk.cfg.patch_bias) == ("quick_gelu", 1e-5, 2, False)
    assert vk.preprocess.mean[0] == pytest.approx(0.48145466) and vk.num_classes == 16
    check(vk, x, ref, "OpenAI CLIP visual (load_model)", record_parity)
    wrapped = tmp_path / "epoch_1.pt"  # open_clip training checkpoint: DDP names inside 'state_dict'
    torch.save({"epoch": 1, "state_dict": {"module." + k: v for k, v in clip_sd.items()}}, wrapped)
    check(vitkit.create_model("vit_base_patch32_clip_quickgelu_224", checkpoint_path=wrapped,
                              **dict(TINY, num_classes=16)), x, ref, "OpenAI CLIP visual (create_model, DDP)",
          record_parity)


# ----------------------------------------------------------------------------------------- JAX .npz
@pytest.mark.parametrize("style", ["vit_jax", "big_vision_scan", "big_vision_gap_siglip"])
def test_jax_npz(style, tmp_path, photo_batch, record_parity):
    kw = {"act_layer": "gelu_tanh"}  # flax's nn.gelu is the tanh approximation
    if style == "big_vision_scan":
        kw |= {"no_embed_class": True}
    if style == "big_vision_gap_siglip":
        kw |= {"class_token": False, "global_pool": "avg", "fc_norm": False}
    peer = perturb(TimmViT(**TINY, **kw))
    path = tmp_path / "ckpt.npz"
    if style == "vit_jax":
        arrays = to_jax_arrays(peer.state_dict(), 2, "vit_jax")
        assert "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel" in arrays
    elif style == "big_vision_scan":
        arrays = to_jax_arrays(peer.state_dict(), 2, "big_vision", scan=True)
        assert arrays["params/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"].shape == (2, 128, 512)
    else:  # a SigLIP-like two-tower file: the image tower under params/img/, a text tower beside it
        arrays = to_jax_arrays(peer.state_dict(), 2, "big_vision", prefix="params/img/")
        arrays["params/txt/Embed_0/embedding"] = np.zeros((10, 8), np.float32)
    np.savez(path, **arrays)
    twin = TimmViT(**TINY, **kw).eval()  # timm's own npz reader agrees with the file
    _load_weights(twin, str(path))
    x = photo_batch(32)
    ref = reference(peer, x)
    assert torch.allclose(twin(x), ref[0], atol=1e-6)
    vk = vitkit.load_model(path)
    assert vk.cfg.act == "gelu_tanh" and vk.cfg.num_heads == 2
    assert vk.cfg.prefix_pos == (style == "vit_jax") or not vk.cfg.class_token
    check(vk, x, ref, f"JAX npz {style} (load_model)", record_parity)
    name = "vit_tiny_patch16_gap_224" if "gap" in style else "vit_tiny_patch16_224"
    extra = {"prefix_pos": False} if style == "big_vision_scan" else {}
    if "gap" in style:
        extra = {"fc_norm": False}
    check(vitkit.create_model(name, checkpoint_path=path, **TINY, act="gelu_tanh", **extra), x, ref,
          f"JAX npz {style} (create_model)", record_parity)
    # and back: vitkit's exporter writes the same layout
    out = export_npz(vk, tmp_path / "again.npz", style="vit_jax" if style == "vit_jax" else "big_vision",
                     scan=style == "big_vision_scan")
    check(vitkit.load_model(out), x, ref, f"JAX npz {style} (export_npz round trip)", record_parity)


# ----------------------------------------------------------------------------------------- DINOv2 / DINO / MAE
def to_dinov2(sd: dict, registers: bool, chunks: int = 0) -> dict:
    """timm names -> the dinov2 hub layout (inverse of timm's _convert_dinov2), optionally chunked blocks."""
    out = {k: v for k, v in sd.items() if k not in ("reg_token", "cls_token", "pos_embed")}
    D = sd["cls_token"].shape[-1]
    out["mask_token"] = torch.zeros(1, D)
    if registers:  # the class token's position lives in pos_embed[:, 0] in DINOv2's own layout
        p0 = torch.randn(1, 1, D, generator=torch.Generator().manual_seed(2)) * 0.05
        out |= {"register_tokens": sd["reg_token"], "cls_token": sd["cls_token"] - p0,
                "pos_embed": torch.cat([p0, sd["pos_embed"]], dim=1)}
    else:
        out |= {"cls_token": sd["cls_token"], "pos_embed": sd["pos_embed"]}
    if chunks:
        depth = 1 + max(int(k.split(".")[1]) for k in out if k.startswith("blocks."))
        per = -(-depth // chunks)
        out = {(f"blocks.{int(k.split('.')[1]) // per}.{k.split('.', 1)[1]}" if k.startswith("blocks.") else k): v
               for k, v in out.items()}
    return out


@pytest.mark.parametrize("registers", [True, False], ids=["reg4", "no_reg"])
def test_dinov2_hub_layout(registers, tmp_path, photo_batch, record_parity):
    kw = {"reg_tokens": 4, "no_embed_class": True} if registers else {}
    peer = perturb(TimmViT(**dict(TINY, num_classes=0), init_values=1e-5, **kw))
    flat = to_dinov2(peer.state_dict(), registers)
    twin = TimmViT(**dict(TINY, num_classes=0), init_values=1e-5, **kw).eval()
    twin.load_state_dict(checkpoint_filter_fn(dict(flat), twin))  # timm's DINOv2 reader agrees with the writer
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    ref = reference(peer, x)
    assert torch.allclose(twin(x), ref[0], atol=1e-6)
    path = tmp_path / "dinov2_vits14.pth"
    torch.save(to_dinov2(peer.state_dict(), registers, chunks=2), path)
    vk = vitkit.load_model(path)
    assert vk.provenance["imported_from"] == "dinov2" and vk.cfg.init_values is not None
    assert vk.cfg.prefix_pos == (not registers) and vk.cfg.num_reg_tokens == (4 if registers else 0)
    check(vk, x, ref, f"DINOv2 hub chunked {'reg4' if registers else 'no reg'} (load_model)", record_parity)
    name = "vit_small_patch14_reg4_dinov2" if registers else "vit_small_patch14_dinov2"
    by_name = {k: v for k, v in TINY.items() if k != "num_classes"}
    check(vitkit.create_model(name, checkpoint_path=path, **by_name), x, ref,
          f"DINOv2 hub {'reg4' if registers else 'no reg'} (create_model)", record_parity)


def test_dino_v1_full_checkpoint(tmp_path, photo_batch, record_parity):
    """{'teacher', 'student', 'optimizer', 'args', ...}: the teacher's backbone alone (tower="image"; the whole with
    its head: tests/test_load_whole.py)."""
    peer = perturb(TimmViT(**dict(TINY, num_classes=0)))
    teacher = {"backbone." + k: v for k, v in peer.state_dict().items()}
    teacher |= {"head.mlp.0.weight": torch.randn(256, 128), "head.last_layer.weight_g": torch.ones(1000, 1),
                "head.last_layer.weight_v": torch.randn(1000, 256)}
    student = {"module." + k: v + 1.0 for k, v in teacher.items()}  # different numbers: must not be picked
    torch.save({"teacher": teacher, "student": student, "epoch": 100, "dino_loss": {"center": torch.zeros(1, 1000)},
                "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
                "args": argparse.Namespace(arch="vit_small", patch_size=16, out_dim=1000)}, tmp_path / "full.pth")
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    ref = reference(peer, x)
    vk = vitkit.load_model(tmp_path / "full.pth", tower="image")
    assert vk.num_classes == 0 and vk.family == "vit"
    check(vk, x, ref, "DINO v1 full checkpoint, teacher (load_model)", record_parity)


def test_mae_pretrain_checkpoint(tmp_path, photo_batch, record_parity):
    from test_sincos import mae_get_2d_sincos_pos_embed  # a transcription of MAE's util/pos_embed.py
    from vitkit.layers import sincos_2d_pos_embed

    peer = perturb(TimmViT(**dict(TINY, num_classes=0)))
    mae_table = torch.from_numpy(mae_get_2d_sincos_pos_embed(128, (4, 4))).float()
    with torch.no_grad():  # MAE's fixed encoder table: 2-D sin-cos with a zero class row
        peer.pos_embed.copy_(torch.cat([torch.zeros(1, 128), mae_table])[None])
    Dd = 64  # decoder width
    sd = dict(peer.state_dict())
    sd |= {"mask_token": torch.zeros(1, 1, Dd), "decoder_embed.weight": torch.randn(Dd, 128),
           "decoder_embed.bias": torch.zeros(Dd), "decoder_pos_embed": torch.zeros(1, 17, Dd),
           "decoder_blocks.0.norm1.weight": torch.ones(Dd), "decoder_blocks.0.attn.qkv.weight": torch.randn(3 * Dd, Dd),
           "decoder_norm.weight": torch.ones(Dd), "decoder_pred.weight": torch.randn(8 * 8 * 3, Dd)}
    torch.save({"model": sd}, tmp_path / "mae_pretrain_vit_tiny.pth")
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    ref = reference(peer, x)
    vk = vitkit.load_model(tmp_path / "mae_pretrain_vit_tiny.pth", tower="image")  # the encoder (whole: test_load_whole)
    assert vk.provenance["imported_from"] == "mae" and vk.num_classes == 0 and vk.family == "vit"
    check(vk, x, ref, "MAE pretraining checkpoint, encoder (load_model)", record_parity)
    # the table vitkit generates for a sin-cos model (e.g. when it is resized) is the one MAE stored
    torch.testing.assert_close(vk.pos_embed.detach()[0, 1:], sincos_2d_pos_embed(128, (4, 4)), atol=1e-6, rtol=0)


@pytest.mark.parametrize("registers", [False, True], ids=["Dinov2Model", "Dinov2WithRegistersModel"])
def test_hf_dinov2(registers, tmp_path, photo_batch, record_parity):
    import transformers

    kind = "Dinov2WithRegisters" if registers else "Dinov2"
    cfg = getattr(transformers, f"{kind}Config")(**_hf_tiny(), **({"num_register_tokens": 4} if registers else {}))
    peer = perturb(getattr(transformers, f"{kind}Model")(cfg))
    peer.save_pretrained(tmp_path)
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    with torch.no_grad():
        tokens = peer(pixel_values=x).last_hidden_state  # [B, 1 + R + N, D]
    vk = vitkit.load_model(tmp_path)
    assert vk.cfg.num_reg_tokens == (4 if registers else 0) and vk.cfg.init_values is not None
    with torch.no_grad():
        diff = (vk.forward_features(x) - tokens).abs().max().item()
    check(vk, x, (tokens[:, 0], tokens[:, 0]), f"HF {kind}Model (load_model; all tokens {diff:.1e})", record_parity)
    assert diff <= TOL
