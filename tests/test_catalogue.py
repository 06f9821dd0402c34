"""timm's ViT catalogue under timm's names: every `vit_*` / `deit*` name timm registers is built here or refused
on purpose with a reason; each built name has timm's parameter count at full size (meta device) and timm's
outputs for timm's weights (random, perturbed, fp32; one narrow block and a 2x2-patch image to stay fast)."""
from __future__ import annotations

import fnmatch

import pytest
import timm  # a test dependency: the catalogue is timm's
import torch
from safetensors.torch import save_file

import vitkit
from test_import_timm import perturb
from vitkit.analysis.cost import model_cost
from vitkit.errors import ConfigError
from vitkit.models import get_entry
from vitkit.models.vit_catalogue import CATALOGUE, REFUSED, refusal
from vitkit.models.vit_variants import refused_error

TOL = 1e-4
TIMM_NAMES = sorted(set(timm.list_models("vit_*") + timm.list_models("deit*")))
# hybrids (a CNN stem before the patches) are models/hybrid.py's, not this catalogue's
HYBRID_MODULE = "timm.models.vision_transformer_hybrid"


def _timm_module(name: str) -> str:
    from timm.models import _registry

    return _registry._model_entrypoints[name].__module__


def _architectures() -> dict[str, str]:
    """One name per distinct architecture (names that differ only in resolution, tags or preprocessing run the
    same code at the test's small image size)."""
    seen: dict[str, str] = {}
    for name in sorted(CATALOGUE):
        kw = {k: v for k, v in CATALOGUE[name][0].items() if k != "img_size"}
        seen.setdefault(repr(sorted(kw.items())), name)
    return dict(sorted((n, k) for k, n in seen.items()))


def test_every_timm_name_is_built_or_refused_with_a_reason():
    built = [n for n in TIMM_NAMES if n in vitkit.list_models()]
    refused = [n for n in TIMM_NAMES if n not in built and refusal(n)]
    hybrids = [n for n in TIMM_NAMES if _timm_module(n) == HYBRID_MODULE]
    missing = sorted(set(TIMM_NAMES) - set(built) - set(refused) - set(hybrids))
    assert not missing, missing
    assert set(CATALOGUE) <= set(built)
    assert not set(built) & set(refused), "a built name is also refused"
    # every refusal pattern still names something timm has (a stale entry would hide a new name)
    assert all(fnmatch.filter(TIMM_NAMES, pat) for pat in REFUSED), [p for p in REFUSED if not fnmatch.filter(
        TIMM_NAMES, p)]
    assert len(built) >= 140


def test_a_refused_name_gives_one_line_with_the_reason():
    err = refused_error("vit_base_patch16_18x2_224")
    assert isinstance(err, ConfigError) and "\n" not in str(err) and "side by side" in str(err)
    assert refused_error("vit_base_patch16_224") is None
    with pytest.raises(ConfigError, match="side by side"):  # never a model that silently differs from timm's
        vitkit.create_model("vit_base_patch16_18x2_224")


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_full_size_parameter_count_and_defaults_equal_timm(name):
    """vitkit's closed-form count (test_cost.py checks it against the built model for every name) against timm's
    model built on the meta device."""
    entry = get_entry(name)
    with torch.device("meta"):
        theirs = timm.create_model(name)
    assert model_cost(name).params_total == sum(p.numel() for p in theirs.parameters())
    pc = theirs.pretrained_cfg
    assert (entry.cfg.num_classes, entry.cfg.img_size) == (theirs.num_classes, tuple(pc["input_size"][1:]))
    assert (entry.mean, entry.std, entry.crop_pct) == (tuple(pc["mean"]), tuple(pc["std"]), pc["crop_pct"])
    assert next(iter(entry.pretrained), None) == (pc.get("tag") if entry.pretrained else None)


@pytest.mark.parametrize("name", list(_architectures()))
def test_outputs_equal_timm_for_timm_weights(name, tmp_path, photo_batch, record_parity):
    cfg = vitkit.model_config(name)
    patch = cfg.patch_size
    # one block, a 2x2-patch image and 16 channels per head: the name's structure (heads, MLP ratio, tokens,
    # norms, pooling, head) at a size the suite can afford; full-size shapes are the parameter test's
    small = {"depth": 1, "img_size": 2 * patch, "embed_dim": 16 * cfg.num_heads}
    peer = perturb(timm.create_model(name, num_classes=7, **small))
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(path))
    ours = vitkit.create_model(name, checkpoint_path=path, **small).eval()
    x = photo_batch(2 * patch)
    with torch.no_grad():
        ref, ref_feats = peer(x), peer.forward_head(peer.forward_features(x), pre_logits=True)
        lo = (ours(x) - ref).abs().max().item()
        fe = (ours.forward_head(ours.forward_features(x), pre_logits=True) - ref_feats).abs().max().item()
    assert ref.std() > 1e-3
    record_parity(f"catalogue {name} (1 narrow block)", lo, fe)
    assert lo <= TOL and fe <= TOL, (lo, fe)


# what a DINOv3 file cannot say: its rotary settings, mean pooling despite a class token, LayerNorm epsilon
DINOV3_TOLD = {"rope": "dinov3", "rope_temperature": 100.0, "rope_rotate_half": True, "global_pool": "avg",
               "fc_norm": False, "norm_eps": 1e-5}


@pytest.mark.parametrize("name,expect,told", [
    ("vit_giant_patch14_dinov2", {"mlp_layer": "swiglu_packed", "global_pool": "token"}, {}),
    ("vit_base_patch16_siglip_224", {"mlp_layer": "mlp", "global_pool": "map"}, {}),
    ("vit_small_plus_patch16_dinov3_qkvb", {"mlp_layer": "swiglu", "k_bias": False}, DINOV3_TOLD),
    ("vit_srelpos_small_patch16_224", {"rel_pos": "mlp_shared", "global_pool": "avg", "fc_norm": False}, {}),
    ("vit_relpos_small_patch16_224", {"rel_pos": "mlp", "global_pool": "avg", "fc_norm": True}, {}),
    ("vit_small_patch16_rope_mixed_224", {"rope": "mixed", "pos_embed": "none"}, {}),
])
def test_a_bare_timm_file_is_read_by_its_shapes(name, expect, told, tmp_path, photo_batch, record_parity):
    """No name given: packed / split SwiGLU, the MAP head, q/v-only biases, relative-position MLPs and RoPE-Mixed's
    frequencies are read off the tensors; what leaves no tensor (fixed rotary tables, ...) is `told`."""
    heads = vitkit.model_config(name).num_heads
    small = {"depth": 1, "img_size": 28, "patch_size": 14, "embed_dim": 64 * heads // 4, "num_classes": 5}
    peer = perturb(timm.create_model(name, **small))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(tmp_path / "w.safetensors"))
    ours = vitkit.load_model(tmp_path / "w.safetensors", num_heads=heads, img_size=28, **told).eval()
    assert {k: getattr(ours.cfg, k) for k in expect} == expect
    x = photo_batch(28)
    with torch.no_grad():
        diff = (ours(x) - peer(x)).abs().max().item()
    record_parity(f"bare timm file {name} (load_model)", diff, diff)
    assert diff <= TOL


def test_a_timm_hub_folder_names_its_heads(tmp_path, photo_batch, record_parity):
    """vit_base_patch16_gap_224 has 16 heads at width 768 (not 64 channels each): a timm hub folder's
    architecture name supplies that, where a bare file would need num_heads=."""
    peer = perturb(timm.create_model("vit_base_patch16_gap_224", depth=1, img_size=32, num_classes=5))
    timm.models.save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    ours = vitkit.load_model(tmp_path / "hub").eval()
    assert ours.cfg.num_heads == 16
    x = photo_batch(32)
    with torch.no_grad():
        diff = (ours(x) - peer(x)).abs().max().item()
    record_parity("timm hub folder vit_base_patch16_gap_224 (load_model)", diff, diff)
    assert diff <= TOL


def test_cli_lists_the_refused_names_with_reasons(capsys):
    import json

    from vitkit.cli.main import main

    assert main(["models", "--refused", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["pattern"] for r in rows} == set(REFUSED) and all(r["reason"] == REFUSED[r["pattern"]] for r in rows)
    assert main(["models", "--refused", "sapiens", "--json"]) == 0
    assert [r["pattern"] for r in json.loads(capsys.readouterr().out)] == ["vit_*_sapiens2"]


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_mixed_ape_224", "vit_pe_core_tiny_patch16_384",
                                  "vit_small_patch16_dinov3_qkvb", "vit_medium_patch16_rope_reg1_gap_256"])
def test_rotary_models_match_timm_at_another_resolution(name, tmp_path, photo_batch, record_parity):
    """Two blocks (RoPE-Mixed has one table per block) run at a grid other than the native one: the rotary tables
    (and the resampled absolute table where there is one) are rebuilt for the input as timm's dynamic_img_size
    models rebuild them."""
    heads = vitkit.model_config(name).num_heads
    small = {"depth": 2, "img_size": 32, "embed_dim": 16 * heads}
    peer = perturb(timm.create_model(name, num_classes=5, dynamic_img_size=True, **small))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(tmp_path / "w.safetensors"))
    ours = vitkit.create_model(name, checkpoint_path=tmp_path / "w.safetensors", **small).eval()
    x = photo_batch(48)  # a 3x3 grid, the model's is 2x2
    with torch.no_grad():
        diff = (ours(x) - peer(x)).abs().max().item()
        feats = (ours.forward_features(x) - peer.forward_features(x)).abs().max().item()
    record_parity(f"rotary {name} at 48 px (2 blocks)", diff, feats)
    assert diff <= TOL and feats <= TOL


@pytest.mark.parametrize("name", ["vit_relpos_medium_patch16_cls_224", "vit_srelpos_small_patch16_224"])
def test_relative_position_models_match_timm_at_another_resolution(name, tmp_path, photo_batch, record_parity):
    """The relative-position MLP takes the offsets themselves, so any grid works: a 3x3 grid against timm's model
    resized with set_input_size (two blocks; a class token gets zero bias, as timm pads it)."""
    heads = vitkit.model_config(name).num_heads
    small = {"depth": 2, "img_size": 32, "embed_dim": 16 * heads}
    peer = perturb(timm.create_model(name, num_classes=5, **small))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(tmp_path / "w.safetensors"))
    ours = vitkit.create_model(name, checkpoint_path=tmp_path / "w.safetensors", **small).eval()
    peer.set_input_size(img_size=48)
    x = photo_batch(48)
    with torch.no_grad():
        diff = (ours(x) - peer(x)).abs().max().item()
    record_parity(f"relative positions {name} at 48 px (2 blocks)", diff, diff)
    assert diff <= TOL


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_mixed_224", "vit_relpos_medium_patch16_cls_224"])
def test_rotary_and_relative_position_models_export_to_onnx(name, tmp_path):
    """export_onnx runs the graph in ONNX Runtime and raises when it differs from PyTorch by more than 1e-4."""
    from vitkit.export.onnx import export_onnx

    heads = vitkit.model_config(name).num_heads
    model = vitkit.create_model(name, depth=2, img_size=32, embed_dim=16 * heads, num_classes=3).eval()
    report = export_onnx(model, tmp_path / "m.onnx")
    assert report["max_abs_diff"] <= 1e-4 and (tmp_path / "m.onnx").stat().st_size > 0
