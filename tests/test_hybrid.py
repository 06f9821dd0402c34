"""Hybrid ViTs (a CNN stem before the patches) against timm's `vision_transformer_hybrid`: the same names with
timm's parameter counts and defaults at full size (meta device), timm's outputs for timm's weights (random,
perturbed, fp32, one block and a 64 px image to stay fast) read from a timm file by name and by key signature,
the original JAX `.npz` layout (written here with the inverse mapping, and read by timm's own npz loader too),
the stem's cost, and the small-image hybrid training on real digits."""
from __future__ import annotations

import json

import numpy as np
import pytest
import timm  # a test dependency: parity needs the real peer
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import _load_weights as timm_load_npz

import vitkit
from vitkit.analysis.cost import model_cost
from vitkit.cli.main import main as cli
from vitkit.errors import CheckpointError, ConfigError
from vitkit.layers import EMBED_LAYERS
from vitkit.models import get_entry
from vitkit.weights.importers.jax_npz import export_npz

TOL = 1e-4
HYBRIDS = [n for n in vitkit.list_models() if get_entry(n).group == "hybrid"]
SMALL = {"depth": 1, "img_size": 64, "num_classes": 7}
NARROW = {"embed_dim": 64, "num_heads": 2}  # a thinner transformer where the stem does not fix the width


def perturb_all(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random offsets on every floating tensor (BatchNorm running statistics too, variances kept positive),
    so a mis-mapped or mis-normalised tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, t in model.state_dict().items():
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g) * 0.05)
                if k.endswith("running_var"):
                    t.abs_().add_(0.5)
    return model.eval()


def outputs(model, x):
    model.eval()  # BatchNorm stems: running statistics
    with torch.no_grad():
        return model(x), model.forward_head(model.forward_features(x), pre_logits=True)


def assert_close(ours, ref, name, record):
    (lo, fe), (rlo, rfe) = outputs(ours, ref[0]), ref[1:]
    assert (rlo - rlo.mean(0)).abs().max() > 1e-3  # the peer's outputs depend on the image, or nothing is proven
    d_lo, d_fe = (lo - rlo).abs().max().item(), (fe - rfe).abs().max().item()
    record(name, d_lo, d_fe)
    assert d_lo <= TOL and d_fe <= TOL, (name, d_lo, d_fe)


def test_every_timm_hybrid_is_registered():
    assert sorted(HYBRIDS) == sorted(timm.list_models(module="vision_transformer_hybrid"))


def test_full_size_parameter_counts_and_defaults_equal_timm():
    """Every name at full size against timm's (meta device). A 384 px name differs from its 224 px sibling only in
    position rows: timm's defaults are read for it, its count from the sibling plus the rows (building timm's
    hybrids is the slow part: timm runs its backbone once to size the grid)."""
    counts = {}
    for name in sorted(HYBRIDS, key=lambda n: n.endswith("_384")):  # the 224 px siblings first
        entry = get_entry(name)
        pc = timm.models.get_pretrained_cfg(name).to_dict()
        with torch.device("meta"):
            ours = vitkit.create_model(name)
        counts[name] = sum(p.numel() for n, p in ours.named_parameters() if not n.startswith("head."))  # no head
        sibling = name.replace("_384", "_224")
        if sibling != name:
            extra = ours.embed_dim * (ours.patch_embed.num_patches - get_entry(sibling).cfg.grid_size[0] ** 2)
            assert counts[name] == counts[sibling] + extra, name
            assert ours.num_classes == (pc["num_classes"]), name
        else:
            with torch.device("meta"):
                theirs = timm.create_model(name)
            assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters()), name
            assert ours.patch_embed.grid_size == theirs.patch_embed.grid_size, name
            assert ours.num_classes == theirs.num_classes, name
        assert tuple(ours.cfg.img_size) == tuple(pc["input_size"][1:]), name
        assert (entry.mean, entry.std, entry.crop_pct) == (tuple(pc["mean"]), tuple(pc["std"]), pc["crop_pct"]), name
        # the first tag (what a bare name means) is timm's default; timm's defaults hosted outside the timm/ hub
        # organisation (MobileCLIP's apple/ repos) are not registered; untrained names have no tag
        hub = pc.get("hf_hub_id")
        if not hub:
            assert not entry.pretrained, name
        elif hub.startswith("timm/"):
            assert next(iter(entry.pretrained)) == pc["tag"], name


# one name per stem: (name, transformer overrides the stem allows)
STEMS = [
    ("vit_tiny_r_s16_p8_224", {}),  # ResNetV2 stem only, 8x8 patches on its stride-4 map
    ("vit_small_r26_s32_224", NARROW),  # R26, stride 32
    ("vit_base_r50_s16_384", NARROW),  # R50x1 (3, 4, 9), stride 16
    ("vit_large_r50_s32_224", NARROW),  # R50 (3, 4, 6, 3), stride 32
    ("vit_small_resnet26d_224", NARROW),  # ResNet-26-D
    ("vit_small_resnet50d_s16_224", NARROW),  # ResNet-50-D, three stages
    ("vit_base_resnet50d_224", NARROW),  # ResNet-50-D
    ("vit_base_mci_224", {}),  # MobileCLIP's conv stem ends at the model width: no narrower transformer
]


@pytest.mark.parametrize("name,narrow", STEMS, ids=[s[0] for s in STEMS])
def test_outputs_equal_timm_for_a_timm_file(name, narrow, tmp_path, photo_batch, record_parity):
    kw = SMALL | narrow
    peer = perturb_all(timm.create_model(name, **kw))
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(path))
    entry = get_entry(name)
    x = photo_batch(64, entry.mean, entry.std)
    ref = (x, *outputs(peer, x))
    by_name = vitkit.create_model(name, checkpoint_path=path, **{k: v for k, v in kw.items() if k != "num_classes"})
    assert by_name.num_classes == 7  # the file's head
    assert_close(by_name, ref, f"hybrid {name} (timm file, by name)", record_parity)
    if name != "vit_base_mci_224":  # MobileCLIP's stem has no separate projection to read the width from
        read = vitkit.load_model(path, num_heads=kw.get("num_heads", entry.cfg.num_heads))
        assert read.cfg.embed_layer == entry.cfg.embed_layer and read.cfg.patch_size == entry.cfg.patch_size
        assert read.cfg.img_size == (64, 64) and read.cfg.in_chans == 3
        assert_close(read, ref, f"hybrid {name} (timm file, read off the keys)", record_parity)
    # dense features: one map per block on the stem's grid
    with torch.no_grad():
        final, maps = by_name.forward_intermediates(x[:1], indices=1)
        ref_final, ref_maps = peer.forward_intermediates(x[:1], indices=1)
    g = 64 // entry.cfg.patch_size
    assert maps[0].shape == (1, by_name.embed_dim, g, g) and final.shape[1] == g * g + 1
    assert (maps[0] - ref_maps[0]).abs().max() <= TOL and (final - ref_final).abs().max() <= TOL
    assert by_name.feature_info == peer.feature_info  # the stride is the stem's times the patch on its map


# ---------------------------------------------------------------------------- the original JAX layout
def jax_arrays(sd: dict[str, torch.Tensor], num_heads: int) -> dict[str, np.ndarray]:
    """A timm ResNetV2 hybrid's state dict -> vit_jax's R+ViT arrays, written out independently of vitkit's
    importer (HWIO kernels, [D, H, Dh] attention kernels, `block{s}/unit{u}` numbered from 1)."""
    t = {k: v.detach().float() for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}
    hwio = (2, 3, 1, 0)
    stem = "patch_embed.backbone.stem." if "patch_embed.backbone.stem.conv.weight" in t else "patch_embed.backbone."
    out["conv_root/kernel"] = t[stem + "conv.weight"].permute(hwio)
    out["gn_root/scale"], out["gn_root/bias"] = t[stem + "norm.weight"], t[stem + "norm.bias"]
    for k, v in t.items():
        if not k.startswith("patch_embed.backbone.stages."):
            continue
        _, _, _, s, _, u, *mod = k.split(".")
        mod, kind = ".".join(mod[:-1]), mod[-1]
        jname = {"downsample.conv": "conv_proj", "downsample.norm": "gn_proj"}.get(mod, mod.replace("norm", "gn"))
        leaf = "kernel" if "conv" in jname else ("scale" if kind == "weight" else "bias")
        out[f"block{int(s) + 1}/unit{int(u) + 1}/{jname}/{leaf}"] = v.permute(hwio) if leaf == "kernel" else v
    out["embedding/kernel"] = t["patch_embed.proj.weight"].permute(hwio)
    out["embedding/bias"] = t["patch_embed.proj.bias"]
    out["cls"] = t["cls_token"]
    out["Transformer/posembed_input/pos_embedding"] = t["pos_embed"]
    D = t["cls_token"].shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in t if k.startswith("blocks."))
    for i in range(depth):
        b, o = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        out[o + "LayerNorm_0/scale"], out[o + "LayerNorm_0/bias"] = t[b + "norm1.weight"], t[b + "norm1.bias"]
        out[o + "LayerNorm_2/scale"], out[o + "LayerNorm_2/bias"] = t[b + "norm2.weight"], t[b + "norm2.bias"]
        a = o + "MultiHeadDotProductAttention_1/"
        for n, w, bias in zip(("query", "key", "value"), t[b + "attn.qkv.weight"].chunk(3), t[b + "attn.qkv.bias"].chunk(3)):
            out[a + f"{n}/kernel"] = w.t().reshape(D, num_heads, D // num_heads)
            out[a + f"{n}/bias"] = bias.reshape(num_heads, D // num_heads)
        out[a + "out/kernel"] = t[b + "attn.proj.weight"].t().reshape(num_heads, D // num_heads, D)
        out[a + "out/bias"] = t[b + "attn.proj.bias"]
        for j in (0, 1):
            out[o + f"MlpBlock_3/Dense_{j}/kernel"] = t[b + f"mlp.fc{j + 1}.weight"].t()
            out[o + f"MlpBlock_3/Dense_{j}/bias"] = t[b + f"mlp.fc{j + 1}.bias"]
    out["Transformer/encoder_norm/scale"], out["Transformer/encoder_norm/bias"] = t["norm.weight"], t["norm.bias"]
    out["head/kernel"], out["head/bias"] = t["head.weight"].t(), t["head.bias"]
    return {k: v.contiguous().numpy() for k, v in out.items()}


@pytest.mark.parametrize("name", ["vit_small_r26_s32_224", "vit_tiny_r_s16_p8_224"])
def test_jax_npz_equals_timm(name, tmp_path, photo_batch, record_parity):
    kw = SMALL | (NARROW if name != "vit_tiny_r_s16_p8_224" else {})
    peer = perturb_all(timm.create_model(name, **kw), seed=1)
    path = tmp_path / "jax.npz"
    np.savez(path, **jax_arrays(peer.state_dict(), peer.blocks[0].attn.num_heads))
    x = photo_batch(64)
    ref = (x, *outputs(peer, x))
    # the file is the layout timm's own npz loader reads: a fresh timm model from it gives the same outputs
    again = timm.create_model(name, **kw).eval()
    timm_load_npz(again, str(path))
    assert torch.allclose(outputs(again, x)[0], ref[1], atol=TOL)
    ours = vitkit.create_model(name, checkpoint_path=path, **{k: v for k, v in kw.items() if k != "num_classes"})
    assert_close(ours, ref, f"hybrid {name} (JAX npz, by name)", record_parity)
    # read off the arrays: stem, patch in pixels, heads and size all from the file (flax's GELU is tanh:
    # ask for timm's exact one to compare)
    read = vitkit.load_model(path, act="gelu")
    assert (read.cfg.embed_layer, read.cfg.patch_size, read.cfg.img_size) == (
        get_entry(name).cfg.embed_layer, get_entry(name).cfg.patch_size, (64, 64))
    assert read.provenance["imported_from"] == "vit_jax-npz"
    assert_close(read, ref, f"hybrid {name} (JAX npz, read off the arrays)", record_parity)
    # and back: vitkit's own npz writer round-trips the hybrid
    out = export_npz(ours, tmp_path / "ours.npz")
    assert torch.equal(outputs(vitkit.create_model(name, checkpoint_path=out, **{k: v for k, v in kw.items()
                                                                                  if k != "num_classes"}), x)[0],
                       outputs(ours, x)[0])


def test_npz_export_refuses_a_batchnorm_stem(tmp_path):
    model = vitkit.create_model("vit_small_resnet26d_224", **SMALL, **NARROW)
    with pytest.raises(CheckpointError, match="ResNetV2 hybrids only"):
        export_npz(model, tmp_path / "x.npz")


# ---------------------------------------------------------------------------- cost, errors, adaptation
@pytest.mark.parametrize("name", ["vit_tiny_r_s16_p8_224", "vit_small_r26_s32_224", "vit_tiny_conv_28",
                                  "vit_tiny_conv3_28"])
def test_cost_counts_the_stem(name):
    """`vitkit cost` / `vitkit models` count the CNN stem: its parameters are the module's, its MACs those of
    every convolution on a real run (counted here by hand: output elements x input channels x kernel area)."""
    model = vitkit.create_model(name, img_size=64, depth=1).eval()
    macs = 0

    def count(conv, _inputs, out):
        nonlocal macs
        macs += out[0].numel() * conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]

    for m in model.patch_embed.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(count)
    with torch.no_grad():
        model.patch_embed(torch.randn(1, model.cfg.in_chans, 64, 64))
    cost = model_cost(model)
    assert cost.params["patch_embed"] == sum(p.numel() for p in model.patch_embed.parameters())
    assert cost.macs["patch_embed"] == macs > 0
    assert cost.params_total == sum(p.numel() for p in model.parameters())


def test_bad_sizes_are_one_line_errors():
    with pytest.raises(ConfigError, match="multiple of 16") as e:
        vitkit.create_model("vit_base_r50_s16_224", patch_size=24, img_size=240, depth=1)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="exactly 16"):
        vitkit.create_model("vit_base_mci_224", patch_size=32, depth=1)
    model = vitkit.create_model("vit_tiny_r_s16_p8_224", depth=1, img_size=64)
    with pytest.raises(ConfigError, match="not divisible by the patch size 32x32"):
        model(torch.randn(1, 3, 80, 64))
    with pytest.raises(ConfigError, match=r"expected input of shape \[batch, 3, H, W\]"):
        model(torch.randn(1, 1, 64, 64))


def test_unknown_stem_in_a_checkpoint_is_named(tmp_path):
    peer = timm.create_model("vit_small_r26_s32_224", **SMALL, **NARROW)
    sd = {k: v for k, v in peer.state_dict().items() if ".stages.3." not in k}  # an R26 without its last stage
    path = tmp_path / "odd.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    with pytest.raises(CheckpointError, match=r"blocks per stage \(2, 2, 2\) is not a registered stem"):
        vitkit.load_model(path)


def test_first_conv_adapts_to_gray_input():
    rgb = EMBED_LAYERS["resnetv2_r26"](64, 32, 3, 64)
    gray = EMBED_LAYERS["resnetv2_r26"](64, 32, 1, 64)
    sd = {f"patch_embed.{k}": v for k, v in rgb.state_dict().items()}
    adapted = gray.adapt_state_dict(sd)
    w = adapted["patch_embed.backbone.stem.conv.weight"]
    assert w.shape[1] == 1 and torch.allclose(w, sd["patch_embed.backbone.stem.conv.weight"].sum(1, keepdim=True))


# ---------------------------------------------------------------------------- the small-image hybrid
def test_small_image_hybrid_trains_on_digits(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["train", "--model", "vit_tiny_conv_28", "--data", "digits", "--out", str(out), "--epochs", "1",
                "--json", "--quiet", "--set", "steps_per_epoch=3", "--set", "batch_size=16",
                "--set", "threads=1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "done" and 0 <= summary["final"]["top1"] <= 100
    model = vitkit.load_model(out / "last.safetensors")
    assert model.cfg.embed_layer == "conv_small" and model.patch_embed.grid_size == (7, 7)
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert len(steps) >= 3 and all(np.isfinite(s["loss"]) for s in steps if "loss" in s)


@pytest.mark.parametrize("name, embed, convs", [("vit_tiny_conv_28", "conv_small", 2),
                                                ("vit_tiny_conv3_28", "conv_small3", 3)])
def test_small_conv_stems_are_told_apart_by_their_keys(tmp_path, name, embed, convs):
    """A bare state dict (no config) of either small stem loads as that stem: the conv count is the signature
    (a third `backbone.2.conv` once read as MobileCLIP's stem, which has no separate projection)."""
    ours = perturb_all(vitkit.create_model(name, depth=1).eval())  # ViT-Ti width: 3 heads, as read off the keys
    assert sum(isinstance(m, torch.nn.Conv2d) for m in ours.patch_embed.backbone.modules()) == convs
    path = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(path))
    loaded = vitkit.load_model(path).eval()
    assert loaded.cfg.embed_layer == embed and loaded.patch_embed.grid_size == (7, 7)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded(x), ours(x))


def test_a_small_conv_stem_of_unregistered_depth_is_named(tmp_path):
    sd = vitkit.create_model("vit_tiny_conv3_28", depth=1, embed_dim=32, num_heads=2).state_dict()
    sd["patch_embed.backbone.3.conv.weight"] = sd["patch_embed.backbone.2.conv.weight"].clone()  # a fourth conv
    path = tmp_path / "four.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    with pytest.raises(CheckpointError, match=r"conv-small stem with convs \(4,\) is not a registered stem"):
        vitkit.load_model(path)
