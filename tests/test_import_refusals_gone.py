"""Files vitkit used to refuse although it has the layers for them (issue 21 item 6): DINOv2 ViT-g hub files
(SwiGLU `mlp.w12`/`mlp.w3`) and big_vision npz files with a MAP (attention-pooling) head. Each file is written
in the peer's own layout from a reduced-size timm model, checked against timm's own reader, then imported by
vitkit and compared with the timm model at the catalogue's 1e-5 bar."""
from __future__ import annotations

import numpy as np
import pytest
import timm  # a test dependency: parity needs the real peer
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import _load_weights, checkpoint_filter_fn

import vitkit
from test_import_foreign import to_dinov2
from test_import_timm import perturb, reference
from vitkit.errors import CheckpointError
from vitkit.weights.importers.jax_npz import export_npz, to_jax_arrays

PARITY_BAR = 1e-5  # the catalogue's bar (test_import_timm.check uses the older, looser 1e-4)
# ViT-g's layout (packed SwiGLU, LayerScale, patch 14) at a width and depth that run in a second
GIANT = dict(img_size=56, patch_size=14, embed_dim=128, depth=2, num_heads=2, num_classes=0)
# SigLIP's image tower (no class token, MAP pooling, a head) at test size; big_vision's flax nn.gelu is the
# tanh approximation, which the npz importer states, so the timm reference runs it too
SIGLIP = dict(img_size=32, patch_size=8, embed_dim=128, depth=2, num_heads=2, num_classes=16, act_layer="gelu_tanh")
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def assert_parity(vk, x, ref, name, record):
    """vitkit's logits and pre-logits features against the timm reference `ref`, at PARITY_BAR."""
    assert ref[0].std() > 1e-3  # a degenerate peer output would prove nothing
    got = reference(vk.eval(), x)
    logits_diff, feats_diff = ((g - r).abs().max().item() for g, r in zip(got, ref))
    record(name, logits_diff, feats_diff)
    assert logits_diff <= PARITY_BAR and feats_diff <= PARITY_BAR, (name, logits_diff, feats_diff)


def dinov2_giant_file(timm_name: str, registers: bool) -> tuple[torch.nn.Module, dict]:
    """A perturbed reduced-size timm ViT-g and its weights in the dinov2 hub layout: `mlp.w12` (the packed
    [x1; x2] projection of SwiGLUFFNFused) and `mlp.w3` (the inverse of timm's _convert_dinov2)."""
    peer = perturb(timm.create_model(timm_name, **GIANT))
    hub = {k.replace(".mlp.fc1.", ".mlp.w12.").replace(".mlp.fc2.", ".mlp.w3."): v
           for k, v in to_dinov2(peer.state_dict(), registers).items()}
    return peer, hub


def map_head_arrays(sd: dict, num_heads: int, prefix: str) -> dict[str, np.ndarray]:
    """timm's `attn_pool.*` -> big_vision's `MAPHead_0/...` arrays, written here by inverting timm's _load_weights
    (independently of vitkit's writer): probe [1, 1, D]; MultiHeadDotProductAttention_0 query/key/value kernels
    [D, H, Dh], biases [H, Dh], out [H, Dh, D]; LayerNorm_0; MlpBlock_0/Dense_{0,1} kernels (in, out)."""
    D = sd["attn_pool.latent"].shape[-1]
    H, Dh = num_heads, D // num_heads
    head, mha = prefix + "MAPHead_0/", prefix + "MAPHead_0/MultiHeadDotProductAttention_0/"
    k_w, v_w = sd["attn_pool.kv.weight"].chunk(2)  # each [D, D]
    k_b, v_b = sd["attn_pool.kv.bias"].chunk(2)
    out = {head + "probe": sd["attn_pool.latent"],
           head + "LayerNorm_0/scale": sd["attn_pool.norm.weight"], head + "LayerNorm_0/bias": sd["attn_pool.norm.bias"],
           mha + "out/kernel": sd["attn_pool.proj.weight"].t().reshape(H, Dh, D), mha + "out/bias": sd["attn_pool.proj.bias"]}
    for name, weight, bias in (("query", sd["attn_pool.q.weight"], sd["attn_pool.q.bias"]),
                               ("key", k_w, k_b), ("value", v_w, v_b)):
        out[mha + f"{name}/kernel"] = weight.t().reshape(D, H, Dh)
        out[mha + f"{name}/bias"] = bias.reshape(H, Dh)
    for j in (0, 1):
        out[head + f"MlpBlock_0/Dense_{j}/kernel"] = sd[f"attn_pool.mlp.fc{j + 1}.weight"].t()
        out[head + f"MlpBlock_0/Dense_{j}/bias"] = sd[f"attn_pool.mlp.fc{j + 1}.bias"]
    return {k: np.ascontiguousarray(v.detach().float().numpy()) for k, v in out.items()}


def big_vision_map_file(path, scan: bool = False) -> tuple[torch.nn.Module, dict]:
    """A perturbed reduced-size timm SigLIP tower written as a big_vision two-tower npz (image tower under
    params/img/, a text tower beside it) with its MAP head; returns the peer and the arrays."""
    peer = perturb(timm.create_model("vit_base_patch16_siglip_224", **SIGLIP))
    sd = peer.state_dict()
    tower = {k: v for k, v in sd.items() if not k.startswith("attn_pool.")}
    arrays = to_jax_arrays(tower, 2, "big_vision", scan=scan, prefix="params/img/") | map_head_arrays(sd, 2, "params/img/")
    arrays["params/txt/Embed_0/embedding"] = np.zeros((10, 8), np.float32)
    np.savez(path, **arrays)
    return peer, arrays


@pytest.mark.parametrize("registers", [False, True], ids=["no_reg", "reg4"])
def test_dinov2_giant_swiglu_file_imports(registers, tmp_path, photo_batch, record_parity):
    timm_name = "vit_giant_patch14_reg4_dinov2" if registers else "vit_giant_patch14_dinov2"
    peer, hub = dinov2_giant_file(timm_name, registers)
    w12, w3 = hub["blocks.0.mlp.w12.weight"], hub["blocks.0.mlp.w3.weight"]
    assert w12.shape[0] == 2 * w3.shape[1] and "blocks.0.mlp.fc1.weight" not in hub
    twin = timm.create_model(timm_name, **GIANT).eval()
    twin.load_state_dict(checkpoint_filter_fn(dict(hub), twin))  # timm's DINOv2 reader agrees with the file
    x = photo_batch(56, **IMAGENET)
    ref = reference(peer, x)
    assert torch.allclose(twin(x), ref[0], atol=1e-6)
    path = tmp_path / "dinov2_vitg14.pth"
    torch.save(hub, path)

    vk = vitkit.load_model(path)
    assert vk.provenance["imported_from"] == "dinov2" and vk.cfg.mlp_layer == "swiglu_packed"
    assert vk.cfg.num_reg_tokens == (4 if registers else 0) and vk.cfg.init_values is not None
    assert_parity(vk, x, ref, f"DINOv2 ViT-g SwiGLU {'reg4' if registers else 'no reg'} (load_model)", record_parity)
    # DINOv2's own SwiGLUFFNFused on the file's tensors: w12 -> chunk(2) -> silu(x1) * x2 -> w3
    tokens = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(1))  # [B, T, D]
    x1, x2 = F.linear(tokens, w12, hub["blocks.0.mlp.w12.bias"]).chunk(2, dim=-1)  # 2 x [B, T, hidden]
    expected = F.linear(F.silu(x1) * x2, w3, hub["blocks.0.mlp.w3.bias"])  # [B, T, D]
    with torch.no_grad():
        assert (vk.blocks[0].mlp(tokens) - expected).abs().max().item() <= PARITY_BAR
    by_name = {k: v for k, v in GIANT.items() if k != "num_classes"}
    assert_parity(vitkit.create_model(timm_name, checkpoint_path=path, **by_name), x, ref,
                  f"DINOv2 ViT-g SwiGLU {'reg4' if registers else 'no reg'} (create_model)", record_parity)


def test_dinov2_w12_that_is_not_two_branches_is_refused(tmp_path):
    _, hub = dinov2_giant_file("vit_giant_patch14_dinov2", registers=False)
    hub["blocks.1.mlp.w3.weight"] = torch.zeros(128, 682)  # w3 as wide as w12: not a packed SwiGLU
    torch.save(hub, tmp_path / "dinov2_vitg14.pth")
    with pytest.raises(CheckpointError, match=r"blocks\.1\.mlp\.w12"):
        vitkit.load_model(tmp_path / "dinov2_vitg14.pth")


@pytest.mark.parametrize("scan", [False, True], ids=["blocks", "scanned"])
def test_big_vision_map_head_npz_imports(scan, tmp_path, photo_batch, record_parity):
    label = "big_vision MAP head npz" + (" scanned" if scan else "")
    path = tmp_path / "siglip.npz"
    peer, arrays = big_vision_map_file(path, scan)
    assert arrays["params/img/MAPHead_0/MultiHeadDotProductAttention_0/key/kernel"].shape == (128, 2, 64)
    twin = timm.create_model("vit_base_patch16_siglip_224", **SIGLIP).eval()
    _load_weights(twin, str(path))  # timm's npz reader agrees with the file
    x = photo_batch(32)
    ref = reference(peer, x)
    assert torch.allclose(twin(x), ref[0], atol=1e-6)

    vk = vitkit.load_model(path)
    assert vk.cfg.global_pool == "map" and not vk.cfg.class_token and vk.cfg.act == "gelu_tanh"
    assert vk.provenance["imported_from"] == "big_vision-npz"
    assert_parity(vk, x, ref, f"{label} (load_model)", record_parity)
    by_name = {k: v for k, v in SIGLIP.items() if k != "act_layer"}
    assert_parity(vitkit.create_model("vit_base_patch16_siglip_224", checkpoint_path=path, act="gelu_tanh", **by_name),
                  x, ref, f"{label} (create_model)", record_parity)
    # and back: vitkit's exporter writes the head too, under the same names
    again = export_npz(vk, tmp_path / "again.npz", style="big_vision", scan=scan)
    with np.load(again) as written:
        for key, value in arrays.items():
            if "MAPHead_0" in key:
                assert np.allclose(written[key.replace("params/img/", "params/")], value, atol=1e-7), key
    assert_parity(vitkit.load_model(again), x, ref, f"{label} (export_npz round trip)", record_parity)
