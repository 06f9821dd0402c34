"""The swin family against timm's SwinTransformer: same state dict (timm's keys, loaded strictly and unchanged),
same outputs within 1e-4 in fp32 on a real photo and random images, same parameter counts at full size."""
from __future__ import annotations

import pytest
import timm  # a test dependency: parity needs the real peer
import torch
from timm.models import swin_transformer as timm_swin

import vitkit
from test_import_timm import perturb
from vitkit.errors import ConfigError
from vitkit.layers.window_attention import (
    relative_position_index,
    shifted_window_mask,
    window_partition,
    window_reverse,
)
from vitkit.models import get_entry
from vitkit.models.config import IMAGENET_MEAN, IMAGENET_STD
from vitkit.models.swin import SwinConfig, SwinTransformer

NAMES = ["swin_tiny_patch4_window7_224", "swin_small_patch4_window7_224", "swin_base_patch4_window7_224"]
TOL = 1e-4

# reduced swin_tiny_patch4_window7_224 layouts: (id, timm/vitkit kwargs)
CASES = [
    ("224-ws7", dict(img_size=224, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(2, 4, 8, 16), window_size=7)),
    ("64-ws4", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 4), window_size=4)),
    # 96 px: 24x24 and 12x12 maps are padded to windows of 7, the shift mask built on the padded map
    ("96-ws7-padded", dict(img_size=96, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(2, 2, 4, 4), window_size=7)),
    # 100 px: odd maps (25, 13, 7) -> padded windows and padded patch merging
    ("100-ws7-odd", dict(img_size=100, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(2, 2, 4, 4), window_size=7)),
]


def perturbed_pair(kw: dict, seed: int = 0, **timm_extra):
    ref = perturb(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw, **timm_extra), seed)
    ours = SwinTransformer(SwinConfig(**kw)).eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=True)
    assert not missing and not unexpected
    return ref, ours


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_outputs_match_timm(case, photo_batch, record_parity):
    name, kw = case
    ref, ours = perturbed_pair(kw)
    x = photo_batch(kw["img_size"], IMAGENET_MEAN, IMAGENET_STD)  # astronaut + 2 random images
    with torch.no_grad():
        f_ref, f_ours = ref.forward_features(x), ours.forward_features(x)
        assert f_ours.shape == f_ref.shape  # NHWC, as timm
        pre = (ref.forward_head(f_ref, pre_logits=True) - ours.forward_head(f_ours, pre_logits=True)).abs().max()
        logits = (ref(x) - ours(x)).abs().max()
        feats = (f_ref - f_ours).abs().max()
    record_parity(f"swin {name}", logits.item(), pre.item())
    assert logits <= TOL and pre <= TOL and feats <= TOL, (logits, pre, feats)


def test_other_input_size_matches_timm_dynamic():
    """Built at 224, run at 160 and 200x136: windows fixed from img_size, maps padded, mask built per size."""
    kw = CASES[0][1]
    ref, ours = perturbed_pair(kw, seed=1, dynamic_img_size=True)
    g = torch.Generator().manual_seed(3)
    for size in [(160, 160), (200, 136)]:
        x = torch.randn(2, 3, *size, generator=g)
        with torch.no_grad():
            d = (ref(x) - ours(x)).abs().max()
        assert d <= TOL, (size, d)


def test_intermediates_match_timm(photo_batch):
    ref, ours = perturbed_pair(CASES[1][1], seed=2)
    x = photo_batch(64)
    with torch.no_grad():
        fr, ir = ref.forward_intermediates(x, norm=True)
        fo, io = ours.forward_intermediates(x, norm=True)
        last2 = ours.forward_intermediates(x, indices=2, intermediates_only=True)
        all4 = ours.forward_intermediates(x, intermediates_only=True)
    assert (fr - fo).abs().max() <= TOL
    assert [t.shape for t in io] == [t.shape for t in ir] == [(3, 32 * 2 ** i, 16 >> i, 16 >> i) for i in range(4)]
    assert max((a - b).abs().max().item() for a, b in zip(ir, io)) <= TOL
    assert len(last2) == 2 and torch.equal(last2[1], all4[3])
    assert ours.feature_info == ref.feature_info  # timm's channels, strides and module names
    with torch.no_grad():  # stopped after stage 1: the final features are that stage's, un-normed (timm's)
        for kw in (dict(indices=[0, -3], stop_early=True), dict(indices=[-1], norm=True, stop_early=True)):
            fr, ir = ref.forward_intermediates(x, **kw)
            fo, io = ours.forward_intermediates(x, **kw)
            assert fo.shape == fr.shape and (fr - fo).abs().max() <= TOL, kw
            assert len(io) == len(ir) and max((a - b).abs().max().item() for a, b in zip(ir, io)) <= TOL, kw
        nhwc = ours.forward_intermediates(x, indices=[0], output_fmt="NHWC", intermediates_only=True)
    assert torch.equal(nhwc[0].permute(0, 3, 1, 2), all4[0])
    with pytest.raises(ConfigError, match="out of range"):
        ours.forward_intermediates(x, indices=[4])
    with pytest.raises(ConfigError, match="output_fmt"):
        ours.forward_intermediates(x, output_fmt="NLC")


@pytest.mark.parametrize("name", vitkit.list_models(family="swin"))
def test_full_size_parameter_counts_equal_timm(name):
    with torch.device("meta"):
        ours = vitkit.create_model(name)
        ref = timm.create_model(name, pretrained=False)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}


def test_registered_names_preprocess():
    for name in NAMES:
        e = get_entry(name)
        assert e.family == "swin" and e.cfg.window_size == 7 and e.cfg.patch_size == 4
        assert (e.mean, e.std, e.crop_pct, e.interpolation) == (IMAGENET_MEAN, IMAGENET_STD, 0.9, "bicubic")
    assert get_entry(NAMES[2]).cfg.embed_dim == 128 and get_entry(NAMES[1]).cfg.depths == (2, 2, 18, 2)
    for name in vitkit.list_models(family="swin"):  # every registered name: timm's input size, crop and hub tags
        e = get_entry(name)
        for tag, weights in e.pretrained.items():
            cfg = timm.models.get_pretrained_cfg(f"{name}.{tag}")
            assert weights.hub == cfg.hf_hub_id and tuple(cfg.input_size[1:]) == e.cfg.img_size
            assert (cfg.crop_pct, cfg.interpolation, tuple(cfg.mean)) == (e.crop_pct, e.interpolation, e.mean)


def test_window_helpers_match_timm():
    x = torch.randn(2, 14, 21, 5)
    w = window_partition(x, (7, 7))
    assert torch.equal(w, timm_swin.window_partition(x, (7, 7)))
    assert torch.equal(window_reverse(w, (7, 7), 14, 21), x)
    for wh, ww in [(7, 7), (4, 4), (3, 5)]:
        assert torch.equal(relative_position_index(wh, ww), timm_swin.get_relative_position_index(wh, ww))
    blk = timm_swin.SwinTransformerBlock(dim=8, input_resolution=(14, 14), num_heads=2, window_size=7, shift_size=3)
    assert torch.equal(shifted_window_mask(14, 14, (7, 7), (3, 3)), blk.attn_mask)


def test_block_windows_and_shifts_follow_timm():
    """A stage whose map is no larger than the window attends over the whole map, unshifted (last stage at 224)."""
    m = SwinTransformer(SwinConfig(embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 1, 1, 1)))
    blocks = [(b.window_size, b.shift_size) for s in m.layers for b in s.blocks]
    assert blocks[:6] == [((7, 7), (0, 0)), ((7, 7), (3, 3))] * 3
    assert blocks[6:] == [((7, 7), (0, 0))] * 2
    assert "layers.0.blocks.0.attn.relative_position_index" not in m.state_dict()  # non-persistent, as timm


def test_config_refuses_bad_layouts():
    with pytest.raises(ConfigError):
        SwinConfig(depths=(2, 2), num_heads=(3, 6, 12))
    with pytest.raises(ConfigError):
        SwinConfig(embed_dim=96, num_heads=(5, 6, 12, 24))
    with pytest.raises(ConfigError):
        vitkit.create_model(NAMES[0], window=7)


def to_original_layout(sd: dict, model) -> dict:
    """timm keys -> microsoft/Swin-Transformer keys (downsample at the end of stage i-1, `head`, buffers saved)."""
    import re

    out = {}
    for k, v in sd.items():
        k = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) - 1}.downsample", k)
        out[k.replace("head.fc.", "head.")] = v
    for name, buf in model.named_buffers():  # what the original repo saves and timm drops
        if name.endswith(("relative_position_index", "attn_mask")) and buf is not None:
            out[name] = buf
    return {"model": out}


def test_original_repo_layout_imports_like_timms_filter(photo_batch):
    from vitkit.models.swin import checkpoint_filter

    ref, _ = perturbed_pair(CASES[1][1], seed=4)
    ours = SwinTransformer(SwinConfig(**CASES[1][1])).eval()
    original = to_original_layout(ref.state_dict(), ref)
    assert "layers.0.downsample.reduction.weight" in original["model"] and "head.weight" in original["model"]
    mine = checkpoint_filter(original, ours)
    theirs = timm_swin.checkpoint_filter_fn(original, ref)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    ours.load_state_dict(mine, strict=True)
    x = photo_batch(64)
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max() <= TOL
    assert checkpoint_filter(ref.state_dict(), ours).keys() == ref.state_dict().keys()  # timm keys pass through


def test_checkpoint_at_another_window_loads_with_the_table_resampled():
    from vitkit.layers.window_attention import resize_rel_pos_bias_table
    from vitkit.models.swin import checkpoint_filter

    src = SwinTransformer(SwinConfig(**CASES[0][1]))  # window 7 at 224
    dst = SwinTransformer(SwinConfig(**{**CASES[0][1], "img_size": 256, "window_size": 8}))
    sd = checkpoint_filter(src.state_dict(), dst)
    dst.load_state_dict(sd, strict=True)
    assert sd["layers.0.blocks.0.attn.relative_position_bias_table"].shape == (15 * 15, 2)
    const = torch.full((13 * 13, 3), 0.25)
    assert torch.allclose(resize_rel_pos_bias_table(const, (12, 12)), torch.full((23 * 23, 3), 0.25))
    t = torch.randn(13 * 13, 3)
    assert resize_rel_pos_bias_table(t, (7, 7)) is t
    with torch.no_grad():
        assert torch.isfinite(dst(torch.randn(1, 3, 256, 256))).all()


# ---------------------------------------------------------------------------- closed-form cost
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cost_counts_the_real_model(case):
    """Parameters equal the model's; MACs equal torch's FlopCounterMode (which counts the linears, convs and
    merging matmuls) plus the attention scores measured on the windows the blocks really attend over."""
    from torch.utils.flop_counter import FlopCounterMode

    from vitkit.layers.window_attention import WindowAttention
    from vitkit.models.swin import swin_cost

    cfg = SwinConfig(**case[1])
    model = SwinTransformer(cfg).eval()
    cost = swin_cost(cfg)
    assert sum(cost["params"].values()) == sum(p.numel() for p in model.parameters())
    scores = []  # QK^T and AV: 2 * windows * N^2 * C per attention call
    hooks = [m.register_forward_pre_hook(lambda m, a: scores.append(2 * a[0].shape[0] * a[0].shape[1] ** 2
                                                                   * a[0].shape[2]))
             for m in model.modules() if isinstance(m, WindowAttention)]
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, 3, *cfg.img_size))
    for h in hooks:
        h.remove()
    assert cost["macs"]["attn_scores"] == sum(scores)
    assert sum(cost["macs"].values()) - cost["macs"]["attn_scores"] == counter.get_total_flops() // 2


@pytest.mark.parametrize("name,gmacs", [(NAMES[0], 4.51), (NAMES[1], 8.77), (NAMES[2], 15.47),
                                        ("swin_base_patch4_window12_384", 47.19),
                                        ("swin_large_patch4_window7_224", 34.53)])
def test_cost_matches_timm_published_gmacs(name, gmacs):
    from vitkit.analysis.cost import model_cost

    r = model_cost(name)  # timm's figures count LayerNorms and softmax too (<1% here)
    assert r.gmacs_per_image == pytest.approx(gmacs, rel=1e-2)
    with torch.device("meta"):
        assert r.params_total == sum(p.numel() for p in vitkit.create_model(name).parameters())


def test_cost_cli_shows_window_vs_global_attention(capsys):
    import json

    from vitkit.cli.main import main

    stages = {}
    for size in (224, 384):
        assert main(["cost", NAMES[0], "--img-size", str(size), "--json"]) == 0
        stages[size] = json.loads(capsys.readouterr().out)["stages"]
    s224 = stages[224]
    assert s224["tokens"] == {"stage0": 56 * 56, "stage1": 28 * 28, "stage2": 14 * 14, "stage3": 7 * 7}
    # stage 0 at 224: 64 windows of 49 tokens, 3 heads, 2 blocks, against 3136^2 scores per head and block
    assert s224["attn_scores"]["stage0"] == 2 * 3 * 64 * 49 * 49
    assert s224["global_attn_scores"]["stage0"] == 2 * 3 * 3136 ** 2
    ratio = {s: sum(v["global_attn_scores"].values()) / sum(v["attn_scores"].values()) for s, v in stages.items()}
    assert ratio[384] > 2 * ratio[224] > 2  # global attention grows with T^2, windows with T
    assert main(["cost", NAMES[0]]) == 0
    assert "windows vs global attention" in capsys.readouterr().out
