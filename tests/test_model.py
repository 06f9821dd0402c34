"""The model contract of VisionTransformer: shapes, equivalences, resolution handling, save/load."""
import pytest
import torch

import vitkit
from vitkit import ConfigError, VisionTransformer, ViTConfig
from vitkit.layers import resample_pos_embed, sincos_2d_pos_embed
from vitkit.models.vision_transformer import patchify

TINY = dict(embed_dim=64, depth=2, num_heads=4, img_size=32, patch_size=8, num_classes=5)


def tiny(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(ViTConfig(**(TINY | kw))).eval()


def closed_form_params(D, depth, p, n_patches, K, C=3):
    """The ViT paper's parameter count: blocks + patch embed + (N+1) positions + cls + final LN + head."""
    return depth * (12 * D * D + 13 * D) + (C * p * p + 1) * D + (n_patches + 2) * D + 2 * D + (D + 1) * K


@pytest.mark.parametrize("name,expected", [
    ("vit_base_patch16_224", 86_567_656),
    ("vit_large_patch16_224", 304_326_632),
    ("vit_huge_patch14_224", 632_045_800),
])
def test_param_counts_match_paper_on_meta_device(name, expected):
    with torch.device("meta"):
        m = vitkit.create_model(name, num_classes=1000)  # ViT-H/14's default head follows timm's (none)
    n = sum(p.numel() for p in m.parameters())
    cfg = m.cfg
    assert n == expected
    assert n == closed_form_params(cfg.embed_dim, cfg.depth, cfg.patch_size, m.patch_embed.num_patches, 1000)


def test_patch_embedding_is_per_patch_linear_map():
    m = tiny()
    x = torch.randn(2, 3, 32, 32)
    conv = m.patch_embed(x).reshape(2, -1, 64)  # [B, N, D]
    w = m.patch_embed.proj.weight.reshape(64, -1)  # [D, C*p*p], (C, p, p) order
    flat = patchify(x, 8) @ w.T + m.patch_embed.proj.bias  # the paper's x_p E
    torch.testing.assert_close(conv, flat, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", [{}, {"distilled": True}, {"num_reg_tokens": 3, "prefix_pos": False},
                                {"class_token": False, "global_pool": "avg"}, {"qk_norm": True, "init_values": 0.1}])
def test_eager_attention_equals_fused_and_returns_weights(kw):
    m = tiny(**kw)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fused = m(x)
        eager, attns = m(x, return_attn=True)
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)
    T = m.num_prefix_tokens + 16
    assert len(attns) == 2 and attns[0].shape == (2, 4, T, T)
    torch.testing.assert_close(attns[0].sum(-1), torch.ones(2, 4, T))
    assert all(b.attn.fused for b in m.blocks)  # the per-call eager path leaves the default alone


def test_attn_map_hook_sees_probabilities():
    m = tiny()
    seen = []
    m.blocks[1].attn.attn_map.register_forward_hook(lambda mod, i, o: seen.append(o))
    with torch.no_grad():
        m(torch.randn(1, 3, 32, 32))
        assert not seen  # fused path: no matrix is formed
        m.blocks[1].attn.fused = False
        m(torch.randn(1, 3, 32, 32))
    assert len(seen) == 1 and seen[0].shape == (1, 4, 17, 17)


def test_any_divisible_resolution_including_non_square():
    m = tiny()
    for h, w in [(32, 32), (16, 48), (64, 24)]:
        assert m(torch.randn(1, 3, h, w)).shape == (1, 5)
    with pytest.raises(ConfigError, match="not divisible"):
        m(torch.randn(1, 3, 30, 32))
    with pytest.raises(ConfigError, match="batch"):
        m(torch.randn(1, 1, 32, 32))


def test_dynamic_resample_equals_set_input_size():
    m = tiny()
    x = torch.randn(2, 3, 48, 64)
    with torch.no_grad():
        dynamic = m(x)
        m.set_input_size((48, 64))
        assert m.pos_embed.shape == (1, 1 + 6 * 8, 64)
        static = m(x)
    torch.testing.assert_close(dynamic, static)


def test_resample_keeps_prefix_rows_and_is_identity_at_same_size():
    pos = torch.randn(1, 3 + 4 * 4, 8)
    out = resample_pos_embed(pos, (6, 2), (4, 4), num_prefix_tokens=3)
    assert out.shape == (1, 3 + 12, 8)
    assert torch.equal(out[:, :3], pos[:, :3])
    assert resample_pos_embed(pos, (4, 4), num_prefix_tokens=3) is pos
    # bilinear of a constant table is the same constant
    const = torch.ones(1, 16, 4)
    torch.testing.assert_close(resample_pos_embed(const, (7, 3), interpolation="bilinear"), torch.ones(1, 21, 4))


def test_sincos_table_layout():
    """MAE's layout (tests/test_sincos.py checks the numbers): the first half encodes the column (w), so it
    is constant down a column of the grid; the second half encodes the row (h), constant along a row."""
    t = sincos_2d_pos_embed(16, (3, 5))
    assert t.shape == (15, 16)
    cols, rows = t[:, :8].reshape(3, 5, 8), t[:, 8:].reshape(3, 5, 8)
    assert torch.equal(cols, cols[:1].expand(3, -1, -1)) and not torch.equal(cols, cols[:, :1].expand(-1, 5, -1))
    assert torch.equal(rows, rows[:, :1].expand(-1, 5, -1)) and not torch.equal(rows, rows[:1].expand(3, -1, -1))
    # along the first row, the column half runs through sin/cos of the column index: sin(0 * w0) = 0, sin(1) ...
    torch.testing.assert_close(cols[0, :, 0], torch.sin(torch.arange(5.0)))
    m = tiny(pos_embed="sincos")
    assert not m.pos_embed.requires_grad and torch.all(m.pos_embed[0, 0] == 0)


def test_forward_intermediates():
    m = tiny(num_reg_tokens=2)
    x = torch.randn(2, 3, 32, 48)
    final, inter = m.forward_intermediates(x, indices=[0, -1])
    assert final.shape == (2, 3 + 24, 64)
    assert [t.shape for t in inter] == [(2, 64, 4, 6)] * 2
    with torch.no_grad():
        torch.testing.assert_close(m.norm(inter[1].flatten(2).transpose(1, 2)), m.forward_features(x)[:, 3:])
    only = m.forward_intermediates(x, indices=1, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)
    assert only[0][0].shape == (2, 24, 64) and only[0][1].shape == (2, 3, 64)
    with pytest.raises(ConfigError, match="out of range"):
        m.forward_intermediates(x, indices=[5])
    with pytest.raises(ConfigError, match="output_fmt"):
        m.forward_intermediates(x, output_fmt="NHWC")
    assert m.feature_info == [dict(module=f"blocks.{i}", num_chs=64, reduction=8) for i in range(len(m.blocks))]
    # grad checkpointing takes part here too (as in forward_features): same maps, and backward runs block 0's
    # attention again (its recomputation; module hooks do not see it, so its forward is wrapped)
    m.set_grad_checkpointing(True)
    calls, attn_forward = [], m.blocks[0].attn.forward
    m.blocks[0].attn.forward = lambda *a, **k: calls.append(1) or attn_forward(*a, **k)
    ckpt = m.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
    torch.testing.assert_close(ckpt, inter)
    ckpt[0].sum().backward()
    del m.blocks[0].attn.forward
    assert len(calls) == 2 and m.patch_embed.proj.weight.grad is not None


def test_pooling_and_head_contract():
    for pool in ("token", "avg", "max"):
        m = tiny(global_pool=pool)
        feats = m.forward_features(torch.randn(2, 3, 32, 32))
        assert m.forward_head(feats, pre_logits=True).shape == (2, 64)
        assert m.forward_head(feats).shape == (2, 5)
    assert isinstance(tiny(global_pool="avg").fc_norm, torch.nn.LayerNorm)
    m = tiny()
    m.reset_classifier(3)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 3) and m.cfg.num_classes == 3
    m.reset_classifier(0)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 64)
    with pytest.raises(ConfigError):
        tiny(class_token=False, global_pool="token")


def test_distilled_training_returns_both_heads():
    m = tiny(distilled=True)
    m.set_distilled_training(True)
    m.train()
    cls_logits, dist_logits = m(torch.randn(2, 3, 32, 32))
    assert cls_logits.shape == dist_logits.shape == (2, 5) and not torch.equal(cls_logits, dist_logits)
    m.eval()
    with torch.no_grad():
        avg = m(torch.ones(1, 3, 32, 32))
        f = m.forward_features(torch.ones(1, 3, 32, 32))
        torch.testing.assert_close(avg, (m.head(f[:, 0]) + m.head_dist(f[:, 1])) / 2)


def test_grad_checkpointing_same_gradients():
    m = tiny(drop_path_rate=0.0)
    m.train()
    x = torch.randn(2, 3, 32, 32)
    m(x).sum().backward()
    ref = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m.set_grad_checkpointing()
    m(x).sum().backward()
    for a, p in zip(ref, m.parameters()):
        torch.testing.assert_close(a, p.grad, atol=1e-6, rtol=1e-5)


def test_layer_groups_and_no_weight_decay():
    from vitkit.training.optim import group_ids

    m = tiny()
    ids = group_ids([n for n, _ in m.named_parameters()], m.group_matcher())  # from group_matcher, as timm: stem, one group per block (+ final norm), head
    assert ids["cls_token"] == 0 and ids["patch_embed.proj.weight"] == 0
    assert ids["blocks.0.attn.qkv.weight"] == 1 and ids["blocks.1.mlp.fc2.bias"] == 2
    assert ids["norm.weight"] == 2 and ids["head.weight"] == 3
    assert {"pos_embed", "cls_token"} <= m.no_weight_decay()


def test_stochastic_depth_only_in_training():
    m = tiny(drop_path_rate=0.5)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(m(x), m(x))
        m.train()
        assert not torch.equal(m(x), m(x))


@pytest.mark.parametrize("scheme", ["timm", "jax", "moco", "zero_head"])
def test_init_schemes(scheme):
    """Each scheme's distribution, from what the scheme says (D = 64, qkv is [3D, D], fc1 [4D, D]):
    timm: trunc-normal std .02; moco: uniform with xavier's bound for ONE of q/k/v, sqrt(6 / (D + D)), wider
    than xavier over the fused matrix; jax: xavier over the fused matrix, zero head, lecun-normal patch filters."""
    m = tiny(weight_init=scheme)
    assert all(torch.isfinite(p).all() for p in m.parameters())
    D = 64
    qkv, fc1 = m.blocks[0].attn.qkv.weight.detach(), m.blocks[0].mlp.fc1.weight.detach()
    xavier_fused, xavier_fc1, moco_qkv = (6 / (4 * D)) ** 0.5, (6 / (5 * D)) ** 0.5, (6 / (2 * D)) ** 0.5

    def uniform_with_bound(w, bound):  # max |w| within 1% of the bound (thousands of samples), std bound/sqrt(3)
        return 0.99 * bound <= w.abs().max() <= bound and abs(w.std() / (bound / 3**0.5) - 1) < 0.05

    if scheme in ("timm", "zero_head"):
        for w in (qkv, fc1):
            assert abs(w.std() / 0.02 - 1) < 0.05 and w.abs().max() < 0.02 * 6
    elif scheme == "moco":
        assert uniform_with_bound(qkv, moco_qkv) and qkv.abs().max() > 1.3 * xavier_fused  # sqrt(2) wider
        assert uniform_with_bound(fc1, xavier_fc1)
    elif scheme == "jax":
        assert uniform_with_bound(qkv, xavier_fused) and uniform_with_bound(fc1, xavier_fc1)
        pe = m.patch_embed.proj.weight.detach()
        assert abs(pe.std() / (1 / pe[0].numel()) ** 0.5 - 1) < 0.1  # lecun normal, fan_in = C*p*p
        assert 0 < m.blocks[0].mlp.fc1.bias.abs().max() < 1e-5  # jax's normal(1e-6) MLP biases
    if scheme in ("jax", "zero_head"):
        assert torch.all(m.head.weight == 0) and torch.all(m.head.bias == 0)
    else:
        assert m.head.weight.abs().max() > 0


def test_save_load_roundtrip_keeps_config_and_metadata(tmp_path):
    m = tiny(num_reg_tokens=1, prefix_pos=False, in_chans=1)
    path = vitkit.save_model(m, tmp_path / "m.safetensors", class_names=list("abcde"),
                             provenance={"note": "unit test"})
    loaded = vitkit.load_model(path).eval()
    assert loaded.cfg == m.cfg and loaded.class_names == list("abcde")
    assert loaded.provenance["note"] == "unit test" and loaded.provenance["params"] > 0
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), m(x))
    with pytest.raises(vitkit.CheckpointError, match="class names"):
        vitkit.save_model(m, tmp_path / "bad.safetensors", class_names=["a"])


def test_load_adapts_classes_resolution_and_channels(tmp_path, caplog):
    src = tiny()
    path = vitkit.save_model(src, tmp_path / "m.safetensors")
    m = vitkit.load_model(path, num_classes=3, img_size=48)
    assert m.cfg.num_classes == 3 and m.pos_embed.shape == (1, 1 + 36, 64)
    torch.testing.assert_close(m.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)
    gray = vitkit.create_model("vit_tiny_patch16_224", in_chans=1, num_classes=5, embed_dim=64, depth=2,
                               num_heads=4, img_size=32, patch_size=8)
    vitkit.load_weights(gray, path)
    torch.testing.assert_close(gray.patch_embed.proj.weight, src.patch_embed.proj.weight.sum(1, keepdim=True))
    # a gray image through the adapted filters equals an RGB image with equal channels through the original
    x = torch.randn(1, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(gray.eval()(x), src(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=1e-4)


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="unknown model"):
        vitkit.create_model("vit_nonexistent")
    with pytest.raises(ConfigError, match="not divisible by patch"):
        vitkit.create_model("vit_tiny_patch16_224", img_size=100)
    with pytest.raises(ConfigError, match="unknown model option"):
        vitkit.create_model("vit_tiny_patch16_224", widht=3)


def test_variant_decoding_and_registry():
    cfg = vitkit.decode_variant("B/16")
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.patch_size) == (768, 12, 12, 16)
    assert vitkit.decode_variant("S/14@518").img_size == (518, 518)
    names = vitkit.list_models()
    for n in ("vit_tiny_patch16_224", "vit_base_patch16_384", "vit_huge_patch14_224",
              "deit_tiny_distilled_patch16_224", "vit_base_patch16_gap_224", "vit_tiny_patch4_28"):
        assert n in names
    assert vitkit.list_models("deit*") and all(n.startswith("deit") for n in vitkit.list_models("deit*"))


def test_config_json_round_trip_and_unknown_fields():
    from vitkit import Preprocess

    cfg = ViTConfig(**TINY, num_reg_tokens=2, prefix_pos=False)
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["img_size"] == [32, 32]
    with pytest.raises(ConfigError, match="unknown ViT config field"):
        ViTConfig.from_dict(cfg.to_dict() | {"bogus": 1})
    pre = Preprocess(mean=(0.5,), std=(0.5,), input_size=(1, 8, 8))
    assert Preprocess.from_dict(pre.to_dict() | {"written_by": "other tool"}) == pre  # lenient by design
