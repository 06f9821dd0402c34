"""The family seam and the defects it fixed: families in the file format (old files still load), layers
handed to the ViT by name, the token seam, one rule for sin-cos tables, checkpoint heads kept, timm's
keyword names, hub tags that exist, capabilities refused in one line."""
from __future__ import annotations

import json

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.layers import AttentionPoolLatent as TimmAttentionPool
from timm.layers import SwiGLU as TimmSwiGLU
from timm.layers import SwiGLUPacked as TimmSwiGLUPacked

import vitkit
from test_import_timm import perturb as perturbed
from vitkit.cli.main import main as cli
from vitkit.errors import CheckpointError, ConfigError
from vitkit.layers import AttentionPoolLatent, SwiGLU, SwiGLUPacked, register_layer, sincos_2d_pos_embed
from vitkit.layers.mlp import MLP_LAYERS, Mlp
from vitkit.models import get_entry
from vitkit.weights.io import read_safetensors_meta

SMALL = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2}


# ---------------------------------------------------------------------------- the file format
def test_files_name_their_family_and_rebuild_any_family(tmp_path):
    vit = vitkit.create_model("vit_pico_patch2_8")
    rn = vitkit.create_model("resnet18", num_classes=4, in_chans=1, img_size=12)
    for model, family in ((vit, "vit"), (rn, "resnet")):
        path = vitkit.save_model(model, tmp_path / f"{family}.safetensors")
        meta = read_safetensors_meta(path)
        assert meta["vitkit.family"] == family and meta["vitkit.format_version"] == "2"
        again = vitkit.load_model(path)
        assert type(again) is type(model) and again.cfg == model.cfg
        x = torch.randn(2, model.cfg.in_chans, *model.cfg.img_size)
        with torch.no_grad():
            assert torch.equal(again.eval()(x), model.eval()(x))


def _write_format_1(path, model, config: dict) -> None:
    """A file exactly as vitkit wrote it before the family key (format 1)."""
    meta = {"vitkit.format_version": "1", "vitkit.config": json.dumps(config),
            "vitkit.preprocess": json.dumps(model.preprocess.to_dict()), "vitkit.class_names": "[]",
            "vitkit.provenance": json.dumps({"arch": "old"})}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path), metadata=meta)


def test_format_1_files_still_load(tmp_path):
    rn = vitkit.create_model("resnet18", num_classes=3, in_chans=1, img_size=28)
    old_cfg = {"arch": "resnet18", "num_classes": 3, "in_chans": 1, "img_size": [28, 28], "small_stem": True}
    _write_format_1(tmp_path / "rn.safetensors", rn, old_cfg)
    again = vitkit.load_model(tmp_path / "rn.safetensors")
    assert again.family == "resnet" and again.cfg == rn.cfg
    # the shipped fashion-mnist model is a format-1 ViT with the old row-first sin-cos table
    bundled = vitkit.load_model("bundled:fashion-mnist")
    assert bundled.family == "vit" and bundled.cfg.pos_embed == "sincos_hw"
    grid = bundled.patch_embed.grid_size
    stored = bundled.pos_embed[0, bundled._pos_prefix:]
    assert torch.allclose(stored, sincos_2d_pos_embed(bundled.embed_dim, grid, w_first=False), atol=1e-6)
    assert not torch.allclose(stored, sincos_2d_pos_embed(bundled.embed_dim, grid), atol=1e-3)


def test_a_file_of_one_family_refuses_another(tmp_path):
    path = vitkit.save_model(vitkit.create_model("resnet18"), tmp_path / "rn.safetensors")
    with pytest.raises(CheckpointError, match="holds a resnet model; vit_pico_patch2_8 is a vit model"):
        vitkit.create_model("vit_pico_patch2_8", checkpoint_path=path)


def test_load_model_in_chans_override_gives_matching_preprocess(tmp_path):
    path = vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224", **SMALL), tmp_path / "m.safetensors")
    m = vitkit.load_model(path, in_chans=1)
    assert m.cfg.in_chans == 1 and m.preprocess.input_size == (1, 32, 32)
    assert len(m.preprocess.mean) == len(m.preprocess.std) == 1
    assert m.preprocess.mean[0] == pytest.approx(0.5)  # the 3-channel (0.5, 0.5, 0.5) averaged


# ---------------------------------------------------------------------------- layers by name
@pytest.mark.parametrize("ours, theirs, kw", [
    (SwiGLU, TimmSwiGLU, {}),
    (SwiGLUPacked, TimmSwiGLUPacked, {}),
])
def test_swiglu_layers_match_timm(ours, theirs, kw):
    peer = perturbed(theirs(in_features=32, hidden_features=48))
    mine = ours(32, 48)
    mine.load_state_dict(peer.state_dict())  # same key names
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        assert (mine(x) - peer(x)).abs().max() <= 1e-5


def test_attention_pool_matches_timm():
    peer = perturbed(TimmAttentionPool(64, num_heads=4, mlp_ratio=2.0, norm_layer=torch.nn.LayerNorm))
    mine = AttentionPoolLatent(64, 4, mlp_ratio=2.0, eps=1e-5)
    mine.load_state_dict(peer.state_dict())
    x = torch.randn(3, 10, 64)
    with torch.no_grad():
        assert (mine(x) - peer(x)).abs().max() <= 1e-5


def test_map_pooling_model_matches_timm(photo_batch):
    """A SigLIP-style ViT (no class token, MAP head) with the same state dict as timm's."""
    kw = dict(SMALL, class_token=False, global_pool="map", num_classes=7)
    peer = perturbed(timm.models.vision_transformer.VisionTransformer(**kw))
    mine = vitkit.create_model("vit_tiny_patch16_224", **kw).eval()
    mine.load_state_dict(peer.state_dict())
    x = photo_batch(32)
    with torch.no_grad():
        ref = peer(x)
        assert ref.std() > 1e-3 and (mine(x) - ref).abs().max() <= 1e-4


def test_layers_are_handed_in_by_name_or_class_and_persist(tmp_path):
    cfg = vitkit.model_config("vit_tiny_patch16_224", **SMALL)
    m = vitkit.VisionTransformer(cfg, mlp_layer=SwiGLU)
    assert m.cfg.mlp_layer == "swiglu" and isinstance(m.blocks[0].mlp, SwiGLU)
    again = vitkit.load_model(vitkit.save_model(m, tmp_path / "s.safetensors"))
    assert isinstance(again.blocks[0].mlp, SwiGLU)

    class Unregistered(Mlp):
        pass

    with pytest.raises(ConfigError, match="not a registered mlp layer"):
        vitkit.VisionTransformer(cfg, mlp_layer=Unregistered)
    try:
        register_layer("mlp", "test_mlp")(Unregistered)
        m = vitkit.VisionTransformer(cfg, mlp_layer=Unregistered)
        assert m.cfg.mlp_layer == "test_mlp" and type(m.blocks[0].mlp) is Unregistered
        assert type(vitkit.load_model(vitkit.save_model(m, tmp_path / "u.safetensors")).blocks[1].mlp) is Unregistered
    finally:
        MLP_LAYERS.pop("test_mlp", None)


# ---------------------------------------------------------------------------- the token seam
def test_keep_and_mask_go_through_the_one_forward():
    torch.manual_seed(0)
    m = vitkit.create_model("vit_tiny_patch16_224", **SMALL, mask_token=True, num_reg_tokens=2).eval()
    x = torch.randn(2, 3, 32, 32)
    N, P = m.patch_embed.num_patches, m.num_prefix_tokens
    with torch.no_grad():
        full = m.forward_features(x)
        # keeping every patch in order changes nothing
        assert torch.equal(m.forward_features(x, keep=torch.arange(N).expand(2, -1)), full)
        # MAE: a subset of patches, with their own positions, enters the blocks
        keep = torch.tensor([[3, 0, 9], [15, 4, 7]])
        tokens = m.prepare_tokens(x, keep=keep)
        patches = m.patch_embed(x).flatten(1, 2) + m.pos_embed[:, m._pos_prefix:]
        assert tokens.shape == (2, P + 3, 64)
        assert torch.allclose(tokens[:, P:], torch.stack([patches[b, keep[b]] for b in range(2)]))
        assert m.forward_features(x, keep=keep).shape == (2, P + 3, 64)
        # DINOv2/iBOT: masked patches become the mask token (plus their position)
        mask = torch.zeros(2, N, dtype=torch.bool)
        mask[0, 5] = True
        masked = m.prepare_tokens(x, mask=mask)
        pos = m.pos_embed[0, m._pos_prefix + 5]
        assert torch.allclose(masked[0, P + 5], m.mask_token[0, 0] + pos)
        assert torch.equal(masked[1], m.prepare_tokens(x)[1])
    with pytest.raises(ConfigError, match="mask token"):
        vitkit.create_model("vit_tiny_patch16_224", **SMALL).prepare_tokens(x, mask=mask)


# ---------------------------------------------------------------------------- one rule for sin-cos tables
@pytest.mark.parametrize("pos_embed", ["learn", "sincos", "sincos_hw"])
def test_run_time_resize_equals_set_input_size(pos_embed):
    torch.manual_seed(0)
    m = vitkit.create_model("vit_tiny_patch16_224", **SMALL, pos_embed=pos_embed).eval()
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        dynamic = m(x)
        m.set_input_size((48, 64))
        assert torch.allclose(m(x), dynamic, atol=1e-5)
    if pos_embed != "learn":  # regenerated for the 6x8 grid, not stretched
        table = sincos_2d_pos_embed(64, (6, 8), w_first=pos_embed == "sincos")
        assert torch.allclose(m.pos_embed[0, m._pos_prefix:], table, atol=1e-6)


def test_loading_a_sincos_checkpoint_at_another_size_regenerates(tmp_path):
    src = vitkit.create_model("vit_base_patch16_mae", **SMALL)  # an MAE encoder: sin-cos positions
    path = vitkit.save_model(src, tmp_path / "mae.safetensors")
    m = vitkit.load_model(path, img_size=48)
    assert torch.allclose(m.pos_embed[0, m._pos_prefix:], sincos_2d_pos_embed(64, (6, 6)), atol=1e-6)
    assert torch.equal(m.pos_embed[0, : m._pos_prefix], src.pos_embed[0, : src._pos_prefix])


# ---------------------------------------------------------------------------- heads and names
def test_checkpoint_head_is_kept_when_num_classes_is_not_given(tmp_path, photo_batch):
    """timm's CLIP tower file carries the 768->512 image projection as `head`: keep it."""
    peer = perturbed(timm.create_model("vit_base_patch32_clip_quickgelu_224", **SMALL, num_classes=24))
    path = tmp_path / "clip.safetensors"
    save_file(peer.state_dict(), str(path))
    m = vitkit.create_model("vit_base_patch32_clip_quickgelu_224", checkpoint_path=path, **SMALL).eval()
    assert m.num_classes == 24
    x = photo_batch(32)
    with torch.no_grad():
        assert (m(x) - peer(x)).abs().max() <= 1e-4
    # an explicit num_classes still replaces the head
    assert vitkit.create_model("vit_base_patch32_clip_quickgelu_224", checkpoint_path=path, num_classes=0,
                               **SMALL).num_classes == 0


def test_timm_keyword_names_are_accepted(photo_batch):
    kw = dict(SMALL, reg_tokens=2, no_embed_class=True, class_token=False, global_pool="avg", fc_norm=True,
              act_layer="quick_gelu", num_classes=5)
    peer = perturbed(timm.models.vision_transformer.VisionTransformer(**kw, dynamic_img_size=True))
    mine = vitkit.create_model("vit_tiny_patch16_224", **kw, dynamic_img_size=True).eval()
    assert (mine.cfg.num_reg_tokens, mine.cfg.prefix_pos, mine.cfg.act) == (2, False, "quick_gelu")
    mine.load_state_dict(peer.state_dict())
    x = photo_batch(32)
    with torch.no_grad():
        assert (mine(x) - peer(x)).abs().max() <= 1e-4
    assert vitkit.create_model("vit_tiny_patch16_224", **SMALL, act_layer=torch.nn.GELU).cfg.act == "gelu"


@pytest.mark.parametrize("kw, message", [
    ({"dynamic_img_pad": True}, "dynamic_img_pad=True is not supported"),
    ({"global_pool": ""}, "global_pool=''"),
    ({"act_layer": "relu"}, "act_layer='relu' is not supported"),
    ({"norm_layer": torch.nn.BatchNorm1d}, "norm_layer=.* is not supported"),
    ({"embed_dimm": 3}, "unknown model option"),
])
def test_unsupported_timm_keywords_are_one_line_errors(kw, message):
    with pytest.raises(ConfigError, match=message):
        vitkit.create_model("vit_tiny_patch16_224", **kw)


def test_every_registered_hub_tag_exists_in_timm():
    published = set(timm.list_pretrained())
    tags = [(n, t, p.hub) for n in vitkit.list_models() for t, p in get_entry(n).pretrained.items()]
    assert len(tags) >= 15
    missing = [(n, t) for n, t, hub in tags if hub.removeprefix("timm/") not in published]
    assert not missing, f"registered weights timm does not publish: {missing}"


# ---------------------------------------------------------------------------- capabilities
def test_capabilities_a_family_lacks_are_refused_in_one_line(tmp_path, capsys):
    from PIL import Image
    from skimage import data

    path = vitkit.save_model(vitkit.create_model("resnet18", in_chans=3, img_size=32), tmp_path / "rn.safetensors")
    img = tmp_path / "cat.png"
    Image.fromarray(data.chelsea()).save(img)
    assert cli(["explain", str(path), str(img), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs attention maps" in err and "resnet family" in err and "\n" not in err
    assert cli(["cost", "resnet18"]) == 2
    assert "no closed-form cost" in capsys.readouterr().err
    # what every family has still works: predict
    assert cli(["predict", str(path), str(img), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["predictions"][0]["top"]) == 3


def test_a_resnet_checkpoint_fine_tunes_with_a_new_head(tmp_path):
    path = vitkit.save_model(vitkit.create_model("resnet18", num_classes=4, in_chans=1, img_size=16),
                             tmp_path / "rn.safetensors")
    sd = load_file(str(path))
    m = vitkit.load_model(path, num_classes=7)
    assert m.fc.out_features == 7 and torch.equal(m.state_dict()["conv1.weight"], sd["conv1.weight"])
