"""The feature contract every family keeps (timm's): `feature_info` (channels, reduction and module of each map)
and `forward_intermediates` agree, for every family in the registry (a representative of each distinct layout, at
a tiny size); the maps equal timm's for the ViT and the ResNet with the same weights (Swin: tests/test_swin.py,
hybrids: tests/test_hybrid.py); the block-index rule is one helper; and the necks (the segmentation pyramid,
`embed --feature patch`) read only the contract, so a family they have never heard of works with them."""
from __future__ import annotations

import dataclasses
import math

import pytest
import timm  # a test dependency: parity needs the real peer
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import nn

import vitkit
from test_import_timm import perturb
from test_models_contract import tiny_overrides
from vitkit.errors import ConfigError
from vitkit.models import FAMILIES, get_entry
from vitkit.models.config import Preprocess
from vitkit.models.segmentation import Segmenter, backbone_maps
from vitkit.retrieval.embed import check_feature, features_of

TOL = 1e-4
FORMATS = ("NCHW", "NHWC", "NLC")  # every layout a family may offer


def _layout(cfg) -> tuple:
    """What of a config can change the feature layout: its choices (strings, flags, which counts are non-zero),
    not its sizes. Names with the same layout need not all be built."""
    out = []
    for f in dataclasses.fields(cfg):
        if f.name == "num_classes":  # the head comes after every map
            continue
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            out.append((f.name, _layout(v)))
        elif v is None or isinstance(v, (str, bool)):
            out.append((f.name, v))
        elif isinstance(v, (int, float)):
            out.append((f.name, v != 0))
    return tuple(out)


def representatives() -> list[str]:
    """The first registered name of each (family, layout): every family of the registry, new ones included."""
    first: dict[tuple, str] = {}
    for name in vitkit.list_models():
        entry = get_entry(name)
        first.setdefault((entry.family, _layout(entry.cfg)), name)
    return list(first.values())


REPRESENTATIVES = representatives()


def test_every_registered_family_is_represented():
    assert {get_entry(n).family for n in REPRESENTATIVES} == set(FAMILIES)
    assert len(REPRESENTATIVES) < len(vitkit.list_models())  # a subset: the full list is test_models_contract's


def _chw(t: torch.Tensor, fmt: str) -> tuple[int, tuple[int, ...]]:
    """(channels, spatial dims) of a map in `fmt` (NLC: one flattened spatial dim)."""
    if fmt == "NCHW":
        return t.shape[1], tuple(t.shape[2:])
    if fmt == "NHWC":
        return t.shape[3], tuple(t.shape[1:3])
    return t.shape[2], (t.shape[1],)


def _expected(size: tuple[int, int], reduction: int, fmt: str) -> tuple[int, ...]:
    h, w = (math.ceil(s / reduction) for s in size)  # stride-2 convs and patch merging pad odd maps: ceil
    return (h * w,) if fmt == "NLC" else (h, w)


@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_intermediates_agree_with_feature_info(name):
    torch.manual_seed(0)
    model = vitkit.create_model(name, **tiny_overrides(name)).eval()
    info = model.feature_info
    assert info and all(set(e) == {"num_chs", "reduction", "module"} for e in info), info
    assert "intermediates" in model.capabilities and "NCHW" in model.output_fmts
    cfg = model.cfg
    x = torch.randn(1, cfg.in_chans, *cfg.img_size)
    outputs: dict[int, torch.Tensor] = {}  # what the module each entry names gave
    hooks = [model.get_submodule(e["module"]).register_forward_hook(
        lambda mod, args, out, k=k: outputs.__setitem__(k, out)) for k, e in enumerate(info)]
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        for h in hooks:
            h.remove()
        torch.testing.assert_close(final, model.forward_features(x))  # the final features are forward_features'
        picked = model.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
    ends = sorted({0, len(maps) - 1})  # one map when the model gives only one
    assert len(picked) == len(ends) and all(torch.equal(p, maps[i]) for p, i in zip(picked, ends))
    # each map is the output of the module its entry names (in another layout, prefix tokens left out)
    for k, m in enumerate(maps):
        assert torch.isin(m.flatten(), outputs[k].flatten()).all(), (name, info[k]["module"])
    # shapes in every layout: at the native size and at a larger one whose coarse maps are odd (padded: ceil)
    finest = min(e["reduction"] for e in info)
    for size in (tuple(cfg.img_size), tuple(s + finest for s in cfg.img_size)):
        x = torch.randn(1, cfg.in_chans, *size)
        for fmt in FORMATS:
            if fmt not in model.output_fmts:
                with pytest.raises(ConfigError, match="output_fmt"):
                    model.forward_intermediates(x, output_fmt=fmt)
                continue
            with torch.no_grad():
                by_fmt = model.forward_intermediates(x, output_fmt=fmt, intermediates_only=True)
            assert len(by_fmt) == len(info), (name, fmt)
            for k, (m, e) in enumerate(zip(by_fmt, info)):
                chans, spatial = _chw(m, fmt)
                assert chans == e["num_chs"] and spatial == _expected(size, e["reduction"], fmt), (name, size, fmt, k)
    for bad in (0, len(info) + 1, [len(info)], [-len(info) - 1], []):
        with pytest.raises(ConfigError, match="out of range|no feature"):
            model.forward_intermediates(x, indices=bad)


def test_take_indices_is_timms_rule():
    from timm.models._features import feature_take_indices as timm_take

    from vitkit.models.features import feature_take_indices

    for indices in (None, 1, 3, 4, [0], [0, 2], [-1], [1, -1], (0, -3)):
        assert feature_take_indices(4, indices) == timm_take(4, indices), indices
    # in forward order, once each, as the maps come (timm's would be [3, 0, 3] and [0, 0])
    assert feature_take_indices(4, [3, 0, 3]) == ([0, 3], 3) and feature_take_indices(4, [0, -4]) == ([0], 0)
    for bad in (0, 5, [4], [-5], [], "1", [1.0], True):
        with pytest.raises(ConfigError) as err:
            feature_take_indices(4, bad)
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- timm parity
def test_vit_intermediates_and_feature_info_equal_timm(tmp_path, photo_batch):
    peer = perturb(TimmViT(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=2, num_classes=5,
                           reg_tokens=2, no_embed_class=True))
    save_file(peer.state_dict(), str(tmp_path / "w.safetensors"))
    ours = vitkit.load_model(tmp_path / "w.safetensors", num_heads=2).eval()  # a timm file does not record heads
    assert ours.num_prefix_tokens == 3
    assert ours.feature_info == peer.feature_info
    x = photo_batch(32)
    with torch.no_grad():
        for kw in (dict(indices=[0, -1]), dict(indices=2, norm=True), dict(output_fmt="NLC"),
                   dict(indices=[1], stop_early=True), dict(indices=1, return_prefix_tokens=True)):
            ref_final, ref_maps = peer.forward_intermediates(x, **kw)
            final, maps = ours.forward_intermediates(x, **kw)
            assert (final - ref_final).abs().max() <= TOL, kw
            for a, b in zip(maps, ref_maps, strict=True):
                for ta, tb in zip(*(((t,) if torch.is_tensor(t) else t) for t in (a, b)), strict=True):
                    assert ta.shape == tb.shape and (ta - tb).abs().max() <= TOL, kw


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_resnet_intermediates_and_feature_info_equal_timm(arch, photo_batch):
    peer = perturb(timm.create_model(arch, pretrained=False))
    ours = vitkit.create_model(arch, small_stem=False, num_classes=1000, img_size=64).eval()
    ours.load_state_dict(peer.state_dict(), strict=True)  # torchvision's key names are timm's
    strip = [{k: e[k] for k in ("num_chs", "reduction")} for e in peer.feature_info]
    assert [{k: e[k] for k in ("num_chs", "reduction")} for e in ours.feature_info] == strip
    assert [e["module"] for e in ours.feature_info][1:] == [e["module"] for e in peer.feature_info][1:]  # layer1..4
    x = photo_batch(64)[:, :, :, :60]  # 64x60: an even and a padded side
    with torch.no_grad():
        for kw in (dict(), dict(indices=[0, 2]), dict(indices=2), dict(indices=[1], stop_early=True)):
            ref_final, ref_maps = peer.forward_intermediates(x, **kw)
            final, maps = ours.forward_intermediates(x, **kw)
            assert final.shape == ref_final.shape and (final - ref_final).abs().max() <= TOL, kw
            assert [m.shape for m in maps] == [m.shape for m in ref_maps], kw
            assert max((a - b).abs().max().item() for a, b in zip(maps, ref_maps)) <= TOL, kw


def test_clip_image_tower_keeps_the_contract_of_its_vit():
    model = vitkit.create_model("clip_vit_tiny_test").eval()
    assert [e["module"] for e in model.feature_info] == [f"visual.{e['module']}" for e in model.visual.feature_info]
    assert model.output_fmts == model.visual.output_fmts
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[0, 1], output_fmt="NLC")
        ref_final, ref_maps = model.visual.forward_intermediates(x, indices=[0, 1], output_fmt="NLC")
    assert torch.equal(final, ref_final) and all(torch.equal(a, b) for a, b in zip(maps, ref_maps, strict=True))


# ---------------------------------------------------------------------------- the necks read only the contract
class TwoStageNet(nn.Module):
    """A family no neck has heard of: two strided conv stages, the model protocol's image side and the feature
    contract, nothing else (no `cfg`, no `feature_pyramid`, no family name anything knows)."""

    family = "two_stage_test"
    capabilities = frozenset({"intermediates"})
    output_fmts = ("NCHW",)

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU())
        self.stage = nn.Sequential(nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.ReLU())
        self.preprocess = Preprocess((0.5,), (0.5,), "bilinear", 1.0, (1, 16, 16))
        self.feature_info = [dict(num_chs=8, reduction=2, module="stem"), dict(num_chs=12, reduction=4, module="stage")]

    def forward_intermediates(self, x, indices=None, *, norm=False, stop_early=False, output_fmt="NCHW",
                              intermediates_only=False):
        from vitkit.models.features import feature_take_indices

        take, _ = feature_take_indices(len(self.feature_info), indices)
        fine = self.stem(x)  # [B, 8, H/2, W/2]
        coarse = self.stage(fine)  # [B, 12, H/4, W/4]
        maps = [m for i, m in enumerate((fine, coarse)) if i in take]
        return maps if intermediates_only else (coarse, maps)


def test_segmenter_runs_on_a_family_it_does_not_know():
    torch.manual_seed(0)
    net = TwoStageNet()
    x = torch.randn(3, 1, 16, 20)
    maps = backbone_maps(net, x)
    assert [m.shape for m in maps] == [(3, 8, 8, 10), (3, 12, 4, 5)]  # the pyramid: both stages
    seg = Segmenter(net, num_classes=4, dim=8)
    logits = seg(x)
    assert logits.shape == (3, 4, 16, 20)
    logits.square().mean().backward()
    assert net.stem[0].weight.grad.abs().sum() > 0


def test_patch_features_of_a_family_embed_does_not_know():
    net = TwoStageNet().eval()
    check_feature(net, "patch")  # accepted: it has the contract
    x = torch.randn(2, 1, 16, 16)
    f = features_of(net, x, "patch")
    with torch.no_grad():
        coarse = net.stage(net.stem(x))  # [2, 12, 4, 4]
    torch.testing.assert_close(f, F.normalize(coarse.flatten(2).transpose(1, 2), dim=-1))  # [2, 16, 12]
    with pytest.raises(ConfigError, match="forward_intermediates"):
        check_feature(nn.Linear(2, 2), "patch")


# what each neck read from each registered family before the contract (by hand), which the contract gives now
LEGACY_TINY = {
    "vit": lambda: vitkit.create_model("vit_tiny_patch4_28", img_size=32, depth=2, embed_dim=32, num_heads=2,
                                       in_chans=1, num_classes=3),
    "swin": lambda: vitkit.create_model("swin_tiny_patch4_window7_224", img_size=32, in_chans=1, embed_dim=16,
                                        depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), window_size=4, num_classes=3),
    "resnet": lambda: vitkit.create_model("resnet18", in_chans=1, num_classes=3, img_size=32),
    "clip": lambda: vitkit.create_model("clip_vit_tiny_test", in_chans=1),
}


@pytest.mark.parametrize("family", list(LEGACY_TINY))
def test_necks_read_what_they_read_before(family):
    model = LEGACY_TINY[family]().eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        if tokens.ndim == 3:  # a ViT (a CLIP model's image tower): [B, P + N, D] -> patch tokens
            tower = getattr(model, "visual", model)
            patch = tokens[:, tower.num_prefix_tokens:]
        elif family == "resnet":  # [B, F, h, w]
            patch = tokens.flatten(2).transpose(1, 2)
        else:  # Swin, NHWC
            patch = tokens.flatten(1, 2)
        torch.testing.assert_close(features_of(model, x, "patch"), F.normalize(patch, dim=-1))
        maps = backbone_maps(model, x)
        if family == "resnet":
            h = model.maxpool(model.relu(model.bn1(model.conv1(x))))
            want = []
            for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
                h = layer(h)
                want.append(h)
        elif family == "swin":  # the stage outputs (NHWC inside), the last with the final norm
            h, want = model.patch_embed(x), []
            for stage in model.layers:
                h = stage(h)
                want.append(h.permute(0, 3, 1, 2))
            want[-1] = model.norm(h).permute(0, 3, 1, 2)
        else:  # a plain ViT: the last block's map, before the final norm (ViTDet)
            vit = getattr(model, "visual", model)
            blocks = vit.blocks(vit.embed(x))[:, vit.num_prefix_tokens:]  # [B, N, D]
            want = [blocks.transpose(1, 2).reshape(2, -1, 32 // vit.cfg.patch_size, 32 // vit.cfg.patch_size)]
    assert len(maps) == len(want)
    for a, b in zip(maps, want):
        torch.testing.assert_close(a, b)
