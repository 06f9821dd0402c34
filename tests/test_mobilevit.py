"""The `mobilevit` family: MobileViT v1 (`mobilevit_xxs/xs/s`) and v2 (`mobilevitv2_050` ... `200`) under timm's names
and keys, equal to timm's models with the same weights; timm and Hugging Face transformers (MobileViT /
MobileViTV2) files import by key signature; the feature contract at timm's strides, a segmenter on it, and the
training path."""
from __future__ import annotations

import json
import math

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitkit
from test_import_timm import perturb
from vitkit.cli.main import main as cli
from vitkit.errors import CheckpointError, ConfigError
from vitkit.models.segmentation import Segmenter

NAMES = ["mobilevit_xxs", "mobilevit_xs", "mobilevit_s", "mobilevitv2_050", "mobilevitv2_075", "mobilevitv2_100",
         "mobilevitv2_125", "mobilevitv2_150", "mobilevitv2_175", "mobilevitv2_200"]
TOL = dict(rtol=0, atol=5e-5)  # 1.3e-5 seen on mobilevit_s where oneDNN fast paths run (AVX-512, measured on)


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights and BatchNorm statistics too (a fresh BN's mean 0 / var 1 would hide a mis-mapped one)."""
    perturb(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model.eval()


def test_every_timm_name_is_registered():
    assert vitkit.list_models(family="mobilevit") == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_registered_names_equal_timm(name):
    """timm's keys and parameter count, and timm's outputs with the same weights (full models at 64 px)."""
    torch.manual_seed(0)
    theirs = randomised(timm.create_model(name))
    ours = vitkit.create_model(name).eval()
    assert ours.family == "mobilevit" and ours.cfg.img_size == (256, 256)
    assert list(ours.state_dict()) == list(theirs.state_dict())  # timm's keys, in its order
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = theirs(x)
        assert ref.std() > 1e-3  # a degenerate peer output would prove nothing
        torch.testing.assert_close(ours(x), ref, **TOL)
        torch.testing.assert_close(ours.forward_head(ours.forward_features(x), pre_logits=True),
                                   theirs.forward_head(theirs.forward_features(x), pre_logits=True), **TOL)
    assert ours.num_features == theirs.num_features


@pytest.mark.parametrize("name, size", [("mobilevit_xxs", (80, 72)), ("mobilevitv2_050", (64, 128))])
def test_feature_contract_equals_timm(name, size):
    """timm's feature_info (strides 2-32, the final conv as the last map) and timm's maps; v1 at a size whose
    coarse maps are odd (its blocks resize to whole patches and back, as timm's), v2 where patches tile every map
    (timm's v2 keeps a map it enlarged: see the next test)."""
    theirs = randomised(timm.create_model(name, num_classes=0))
    ours = vitkit.create_model(name, num_classes=0).eval()
    ours.load_state_dict(theirs.state_dict())
    assert ours.feature_info == [{k: v for k, v in f.items() if k != "stage"} for f in theirs.feature_info]
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        ref_final, ref_maps = theirs.forward_intermediates(x)
        final, maps = ours.forward_intermediates(x)
        torch.testing.assert_close(final, ref_final, **TOL)
        assert len(maps) == len(ref_maps) == 5
        for m, r in zip(maps, ref_maps):
            torch.testing.assert_close(m, r, **TOL)
        picked = ours.forward_intermediates(x, indices=[1, -2], intermediates_only=True, stop_early=True)
    assert [tuple(p.shape) for p in picked] == [tuple(ref_maps[1].shape), tuple(ref_maps[3].shape)]


@pytest.mark.parametrize("name", ["mobilevit_xxs", "mobilevitv2_050"])
def test_every_map_keeps_its_stride_where_patches_do_not_tile(name):
    """At 80 x 72 the stride-16 and stride-32 maps are odd: a v2 block resizes to whole patches (timm's) and, unlike
    timm's, back, so each map is ceil(size / reduction) as the contract says (the detector's anchors rely on it)."""
    model = vitkit.create_model(name, num_classes=0).eval()
    with torch.no_grad():
        maps = model.forward_intermediates(torch.randn(1, 3, 80, 72), intermediates_only=True)
    assert [tuple(m.shape[1:]) for m in maps] == [(f["num_chs"], math.ceil(80 / f["reduction"]),
                                                   math.ceil(72 / f["reduction"])) for f in model.feature_info]


@pytest.mark.parametrize("name, classes, chans", [("mobilevit_xs", 7, 3), ("mobilevitv2_075", 4, 1)])
def test_timm_files_import_by_key_signature(name, classes, chans, tmp_path):
    """A timm state dict (another class count, one channel, fewer transformer layers) loads as it is: the
    architecture read off the shapes."""
    theirs = randomised(timm.create_model(name, num_classes=classes, in_chans=chans))
    save_file(theirs.state_dict(), str(tmp_path / "timm.safetensors"))
    model = vitkit.load_model(tmp_path / "timm.safetensors").eval()
    entry = vitkit.models.get_entry(name)
    assert model.family == "mobilevit" and model.provenance["imported_from"] == "timm-mobilevit"
    assert model.cfg.replace(num_classes=entry.cfg.num_classes, in_chans=3) == entry.cfg
    assert model.num_classes == classes and model.cfg.in_chans == chans
    x = torch.randn(2, chans, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), **TOL)


def test_a_reduced_timm_file_reads_its_depths(tmp_path):
    sd = randomised(timm.create_model("mobilevit_xxs", num_classes=3)).state_dict()
    shallow = {k: v for k, v in sd.items() if not k.startswith(("stages.3.1.transformer.2.", "stages.3.1.transformer.3.",
                                                                "stages.1.2."))}
    model = vitkit.load_model(shallow)
    assert model.cfg.transformer_depths == (2, 2, 3) and model.cfg.conv_depths == (1, 2)


def _hf_v1():
    from transformers import MobileViTConfig, MobileViTForImageClassification

    cfg = MobileViTConfig(num_labels=5, image_size=64, neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320],
                          hidden_sizes=[64, 80, 96], expand_ratio=2.0, id2label={i: f"c{i}" for i in range(5)},
                          label2id={f"c{i}": i for i in range(5)})
    return "mobilevit_xxs", MobileViTForImageClassification(cfg)


def _hf_v2():
    from transformers import MobileViTV2Config, MobileViTV2ForImageClassification

    return "mobilevitv2_050", MobileViTV2ForImageClassification(MobileViTV2Config(num_labels=5, image_size=64,
                                                                                  width_multiplier=0.5))


@pytest.mark.parametrize("make", [_hf_v1, _hf_v2], ids=["v1-xxs", "v2-050"])
def test_hf_transformers_folders_import_with_parity(make, tmp_path):
    """transformers' own classes, random weights, saved with save_pretrained: the folder loads by key signature
    into the registered architecture, with transformers' outputs on the same tensor."""
    torch.manual_seed(0)
    name, hf = make()
    randomised(hf)
    hf.save_pretrained(tmp_path / "hf")
    model = vitkit.load_model(tmp_path / "hf").eval()
    entry = vitkit.models.get_entry(name)
    assert model.family == "mobilevit" and model.cfg.replace(num_classes=1000, img_size=256) == entry.cfg
    assert model.provenance["imported_from"].startswith("hf-mobilevit")
    if name == "mobilevit_xxs":
        assert model.class_names == [f"c{i}" for i in range(5)]
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = hf(pixel_values=x).logits
        assert ref.std() > 1e-3
        torch.testing.assert_close(model(x), ref, **TOL)


def test_bad_options_and_files_are_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        vitkit.create_model("mobilevit_xxs", block="mobilevit3")
    assert "\n" not in str(e.value) and "mobilevit3" in str(e.value)
    with pytest.raises(ConfigError) as e:
        vitkit.create_model("mobilevitv2_050", stage_chs=(32, 64))
    assert "\n" not in str(e.value)
    sd = timm.create_model("mobilevit_xxs", num_classes=3).state_dict()
    sd["stages.2.1.transformer.0.attn.qkv.weight"] = torch.zeros(3, 3)  # not a [3D, D] packed projection
    with pytest.raises(CheckpointError) as e:
        vitkit.load_model(sd)
    assert "\n" not in str(e.value)


def test_a_segmenter_builds_on_mobilevit():
    """The segmentation seam takes the contract as it is: the four coarsest maps (strides 4-32) into the FPN head."""
    backbone = vitkit.create_model("mobilevit_xxs", num_classes=0)
    seg = Segmenter(backbone, num_classes=3, dim=16)
    x = torch.randn(2, 3, 64, 64)
    out = seg(x)
    assert out.shape == (2, 3, 64, 64)
    out.square().mean().backward()
    assert backbone.stem.conv.weight.grad is not None


def test_trains_through_the_recipes_on_digits(tmp_path):
    run = tmp_path / "run"
    assert cli(["train", "--data", "digits", "--model", "mobilevit_xxs", "--epochs", "1", "--out", str(run),
                "--quiet", "--set", "steps_per_epoch=3", "--set", "batch_size=16", "--set", "threads=1",
                "--set", "bf16=false", "--set", "eval_batch_size=512"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and 0 <= summary["final"]["top1"] <= 100
    model = vitkit.load_model(run / "best.safetensors")
    assert model.family == "mobilevit" and model.cfg.in_chans == 1 and model.num_classes == 10


def test_hf_image_processor_settings_come_with_the_folder(tmp_path):
    """With transformers' MobileViT image processor saved beside the weights: its resize and crop, no
    normalisation, and its BGR channel order folded into the stem, so vitkit's RGB tensor gives what
    transformers gives on the processor's flipped one."""
    from transformers import MobileViTImageProcessor

    torch.manual_seed(0)
    _, hf = _hf_v1()
    randomised(hf)
    hf.save_pretrained(tmp_path / "hf")
    # apple/mobilevit-small's settings: shortest side 288, centre crop 256, bilinear
    MobileViTImageProcessor(size={"shortest_edge": 288}, crop_size={"height": 256, "width": 256},
                            resample=2).save_pretrained(tmp_path / "hf")
    model = vitkit.load_model(tmp_path / "hf").eval()
    pre = model.preprocess
    assert (pre.mean, pre.std, pre.interpolation) == ((0.0,) * 3, (1.0,) * 3, "bilinear")
    assert pre.crop_pct == pytest.approx(256 / 288, abs=1e-4)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x.flip(1)).logits, **TOL)
