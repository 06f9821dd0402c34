"""The closed-form cost calculator against published figures, the real model's parameters (built on the
meta device), torch's FLOP counter and the tensors autograd actually saves."""
import json
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis.cost import MAC_PARTS, PARAM_PARTS, model_cost
from vitkit.errors import CheckpointError, ConfigError


def part_of(param_name: str) -> str:
    """Our own reading of the timm key names, independent of cost.py."""
    if param_name.startswith("patch_embed."):
        return "patch_embed"
    if re.match(r"blocks\.\d+\.(attn\.|ls1\.)", param_name):
        return "attention"
    if re.match(r"blocks\.\d+\.(mlp\.|ls2\.)", param_name):
        return "mlp"
    if re.match(r"(blocks\.\d+\.norm[12]|norm_pre|norm|fc_norm)\.", param_name):
        return "norms"
    if param_name in ("pos_embed", "cls_token", "dist_token", "reg_token", "mask_token", "rope.freqs"):
        return "pos_prefix"
    if param_name.startswith("shared_rel_pos."):  # one relative-position MLP for all blocks
        return "pos_prefix"
    if re.match(r"(head|head_dist|pre_logits|attn_pool)\.", param_name):
        return "head"
    raise AssertionError(f"unexpected parameter {param_name}")


def meta_parts(model) -> dict[str, int]:
    parts = dict.fromkeys(PARAM_PARTS, 0)
    for name, p in model.named_parameters():
        parts[part_of(name)] += p.numel()
    return parts


# ---------------------------------------------------------------------------- published figures
def test_vit_b16_classic_figures():
    r = model_cost("vit_base_patch16_224")
    assert (r.patches, r.tokens, r.attn_scores_per_head_layer) == (196, 197, 38_809)
    assert r.params["patch_embed"] == 590_592
    assert r.params_total == 86_567_656  # torchvision vit_b_16 / timm 86.57M
    assert 0.63 < r.params["mlp"] / r.params_total < 0.68  # "about two thirds of the parameters sit in the MLPs"
    assert r.gmacs_per_image == pytest.approx(17.58, rel=2e-3)  # timm 17.58 (counts LayerNorms too)
    # peers.md closed forms, written out independently
    D, L, K, N, p = 768, 12, 1000, 196, 16
    assert r.params_total == L * (12 * D * D + 13 * D) + (3 * p * p + 1) * D + (N + 2) * D + 2 * D + (D + 1) * K
    assert r.macs_total - r.macs["head"] == L * (12 * 197 * D * D + 2 * 197**2 * D) + N * 3 * p * p * D
    assert round(r.gmacs_per_image, 2) == 17.56


def test_b16_at_384_scales_attention_quadratically_and_mlp_linearly():
    r224, r384 = model_cost("vit_base_patch16_224"), model_cost("vit_base_patch16_224", img_size=384)
    assert r384.tokens == 577
    assert r384.attn_scores_per_head_layer / r224.attn_scores_per_head_layer == pytest.approx(8.6, abs=0.05)
    assert r384.macs["mlp"] / r224.macs["mlp"] == pytest.approx(2.9, abs=0.05)
    assert r384.params_total == model_cost("vit_base_patch16_384").params_total  # position table for a 24x24 grid
    assert r384.gmacs_per_image == pytest.approx(55.54, rel=2e-3)  # timm vit_base_patch16_384


@pytest.mark.parametrize("patch,tokens", [(32, 50), (16, 197), (8, 785)])
def test_patch_size_sets_token_count(patch, tokens):
    assert model_cost(f"vit_base_patch{patch}_224").tokens == tokens


@pytest.mark.parametrize("name,params", [
    ("vit_base_patch16_224", 86_567_656), ("vit_large_patch16_224", 304_326_632),
    ("vit_huge_patch14_224", 632_045_800),  # torchvision vit_b_16 / vit_l_16 / vit_h_14
])
def test_published_parameter_counts(name, params):
    assert model_cost(name, num_classes=1000).params_total == params  # ViT-H/14's default head is timm's (none)


@pytest.mark.parametrize("name,gmacs", [  # timm benchmark csv (1000-class heads, 224)
    ("vit_tiny_patch16_224", 1.26), ("vit_small_patch16_224", 4.61), ("vit_large_patch16_224", 61.60),
    ("vit_huge_patch14_224", 167.4), ("vit_base_patch32_224", 4.41), ("vit_large_patch14_224", 81.08),
    ("vit_large_patch16_384", 191.21),
])
def test_gmacs_match_timm_benchmark(name, gmacs):
    # timm's counter also counts LayerNorms (~0.1-0.5%), which ours leaves out like FlopCounterMode does
    assert model_cost(name).gmacs_per_image == pytest.approx(gmacs, rel=1e-2)


def test_deit_distilled_params_match_readme():
    got = [round(model_cost(f"deit_{s}_distilled_patch16_224").params_total / 1e6, 2) for s in ("tiny", "small", "base")]
    assert got == [5.91, 22.44, 87.34]


# ---------------------------------------------------------------------------- against the real model
@pytest.mark.parametrize("name", vitkit.list_models(family="vit"))
def test_params_match_meta_model(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    r = model_cost(name)
    assert r.params_total == sum(p.numel() for p in model.parameters())
    assert r.params == meta_parts(model)


@pytest.mark.parametrize("overrides", [
    {"qk_norm": True, "init_values": 1e-5, "qkv_bias": False},
    {"num_reg_tokens": 4, "prefix_pos": False, "global_pool": "avg", "class_token": False},
    {"distilled": True, "representation_size": 96, "num_classes": 5},
    {"pos_embed": "none", "final_norm": False, "pre_norm": True, "patch_bias": False, "in_chans": 1},
    {"img_size": (32, 48), "mlp_ratio": 2.5, "global_pool": "max", "fc_norm": False},
    {"pos_embed": "sincos", "num_classes": 0},
    {"global_pool": "map", "class_token": False, "mask_token": True},
    {"mlp_layer": "swiglu", "num_classes": 7},
    {"mlp_layer": "swiglu_packed", "mlp_ratio": 8 / 3, "num_reg_tokens": 2},
    {"mlp_layer": "mlp_dwconv", "mlp_ratio": 2.0},
])
def test_params_match_meta_model_variants(overrides):
    with torch.device("meta"):
        model = vitkit.create_model("vit_small_patch4_32", depth=3, **overrides)
    r = model_cost(model)
    assert r.params == meta_parts(model)
    assert r.params_total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("overrides", [{}, {"distilled": True, "representation_size": 64, "qk_norm": True},
                                       {"global_pool": "map", "mlp_layer": "swiglu"},
                                       {"mlp_layer": "swiglu_packed", "mlp_ratio": 2.5},
                                       {"mlp_layer": "mlp_dwconv", "num_reg_tokens": 2}])
def test_macs_match_torch_flop_counter(overrides):
    model = vitkit.create_model("vit_small_patch4_32", depth=2, **overrides).eval()
    r = model_cost(model, batch=2)
    x = torch.randn(2, 3, 32, 32)
    for blk in model.blocks:
        blk.attn.fused = False  # eager: QK^T and AV are bmm calls the counter sees
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert set(counts) <= {"aten.convolution", "aten.addmm", "aten.mm", "aten.bmm"}  # mm: Linear on a sliced input
    assert counter.get_total_flops() == 2 * r.macs_total
    pool_scores = 2 * 2 * 64 * 384 if overrides.get("global_pool") == "map" else 0  # batch 2, one query over 64 patches
    assert counts["aten.bmm"] == 2 * (r.macs["attn_scores"] + pool_scores)
    dwconv = 2 * 2 * 2 * 64 * 9 * 1536 if overrides.get("mlp_layer") == "mlp_dwconv" else 0  # 2 blocks, batch 2
    assert counts["aten.convolution"] == 2 * r.macs["patch_embed"] + dwconv
    for blk in model.blocks:
        blk.attn.fused = True  # the CPU fused-attention kernel has no FLOP formula in torch: the rest must still match
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    assert counter.get_total_flops() == 2 * (r.macs_total - r.macs["attn_scores"])  # MAP pooling stays eager


def test_a_registered_mlp_layer_is_costed_from_the_layer_itself():
    """An MLP kind the cost code has never heard of (a third linear, bias-free) still gets its own parameters and
    MACs: the cost reads them off the layer, not from a table of kinds."""
    from vitkit.layers import MLP_LAYERS, Mlp, register_layer

    class ThreeLinearMlp(Mlp):
        def __init__(self, dim, hidden, act="gelu", drop=0.0, bias=True):
            super().__init__(dim, hidden, act, drop, bias)
            self.fc3 = torch.nn.Linear(dim, dim, bias=False)

        def forward(self, x):
            return self.fc3(super().forward(x))

    try:
        register_layer("mlp", "test_three_linear")(ThreeLinearMlp)
        model = vitkit.create_model("vit_small_patch4_32", depth=2, mlp_layer="test_three_linear").eval()
        plain = model_cost("vit_small_patch4_32", depth=2, batch=2)
        r = model_cost(model, batch=2)  # MACs for 2 images
        assert r.params_total == sum(p.numel() for p in model.parameters())
        assert r.params["mlp"] - plain.params["mlp"] == 2 * 384 * 384  # fc3 of each of the 2 blocks
        assert r.macs["mlp"] - plain.macs["mlp"] == 2 * 2 * 65 * 384 * 384  # 2 images x 2 blocks x 65 tokens
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(torch.randn(2, 3, 32, 32))
        assert counter.get_total_flops() == 2 * (r.macs_total - r.macs["attn_scores"])  # fused attention uncounted
    finally:
        MLP_LAYERS.pop("test_three_linear", None)


# ---------------------------------------------------------------------------- activation memory
def saved_tensor_bytes(model, x) -> int:
    """Bytes of the distinct non-parameter storages autograd saves for backward in one forward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(seen.values())


@pytest.mark.parametrize("name,overrides,batch,fused,dtype", [
    ("vit_tiny_patch4_28", {}, 4, True, torch.float32),
    ("vit_pico_patch2_8", {}, 8, False, torch.float32),
    ("vit_pico_patch2_8", {"img_size": 32}, 2, False, torch.float32),  # 257 tokens: the T^2 probabilities dominate
    ("vit_small_patch4_32", {"depth": 2}, 2, True, torch.bfloat16),
    ("vit_small_patch4_32", {"depth": 2, "qk_norm": True, "init_values": 1e-5, "num_reg_tokens": 4, "prefix_pos": False}, 2,
     True, torch.float32),
    ("vit_small_patch4_32", {"depth": 2, "pre_norm": True, "class_token": False, "global_pool": "avg"}, 2, False,
     torch.float32),
    ("vit_small_patch4_32", {"depth": 2, "distilled": True, "representation_size": 128}, 2, True, torch.float32),
])
def test_activation_estimate_vs_saved_tensors(name, overrides, batch, fused, dtype):
    model = vitkit.create_model(name, **overrides).to(dtype).train()
    for blk in model.blocks:
        blk.attn.fused = fused
    x = torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size, dtype=dtype)
    measured = saved_tensor_bytes(model, x)
    estimate = model_cost(model, batch=batch, dtype=dtype, fused_attention=fused).activation_bytes
    ratio = estimate / measured
    print(f"{name} {overrides} batch={batch} fused={fused} {dtype}: estimate/measured = {ratio:.3f}")
    assert 0.8 < ratio < 1.25


def test_activation_memory_grows_with_batch_dtype_and_eager_attention():
    fp32 = model_cost("vit_base_patch16_224", batch=8)
    assert model_cost("vit_base_patch16_224", batch=16).activation_bytes == 2 * fp32.activation_bytes
    assert model_cost("vit_base_patch16_224", batch=8, dtype="bf16").activation_bytes * 2 == fp32.activation_bytes
    eager = model_cost("vit_base_patch16_224", batch=8, fused_attention=False)
    T, H, L = 197, 12, 12
    assert eager.activation_bytes - fp32.activation_bytes == 8 * L * H * (T * T - T) * 4  # the probabilities


# ---------------------------------------------------------------------------- inputs and errors
def test_inputs_name_variant_config_model_and_file(tmp_path):
    by_name = model_cost("vit_large_patch14_224")
    assert model_cost("L/14").params_total == by_name.params_total
    assert model_cost(vitkit.model_config("vit_large_patch14_224")).macs == by_name.macs
    assert model_cost("S/14@518").tokens == 37 * 37 + 1
    model = vitkit.create_model("vit_pico_patch2_8")
    model.set_input_size(16)
    assert model_cost(model).tokens == 65  # the model's current resolution
    path = vitkit.save_model(model, tmp_path / "pico.safetensors")
    from_file = model_cost(path, batch=3)
    assert from_file.params_total == sum(p.numel() for p in model.parameters())
    assert from_file.name == "vit_pico_patch2_8" and from_file.tokens == 65
    json.dumps(from_file.to_dict())  # plain JSON types only
    assert set(from_file.params) == set(PARAM_PARTS) and set(from_file.macs) == set(MAC_PARTS)


def test_non_square_and_override():
    r = model_cost("vit_base_patch16_224", img_size=(224, 320), num_classes=10)
    assert r.grid == (14, 20) and r.tokens == 281 and r.params["head"] == 768 * 10 + 10


@pytest.mark.parametrize("call,error", [
    (lambda: model_cost("vit_nonexistent"), ConfigError),
    (lambda: model_cost("vit_base_patch16_224", img_size=225), ConfigError),
    (lambda: model_cost("vit_base_patch16_224", batch=0), ConfigError),
    (lambda: model_cost("vit_base_patch16_224", dtype="int8"), ConfigError),
    (lambda: model_cost("missing/dir/model.safetensors"), CheckpointError),
    (lambda: model_cost(3.5), ConfigError),
])
def test_bad_inputs_raise_clear_errors(call, error):
    with pytest.raises(error) as exc:
        call()
    assert "\n" not in str(exc.value)


def test_families_without_a_closed_form_refuse_in_one_line():
    with pytest.raises(ConfigError, match="resnet family has no closed-form cost"):
        model_cost("resnet18")
    with pytest.raises(ConfigError, match="resnet family has no closed-form cost"):
        model_cost(vitkit.create_model("resnet18"))
