"""`vitkit.data.resolve_data_config` / `vitkit.data.create_transform`: timm's data API by timm's names.

On real photos (skimage.data, written to PNG/JPEG files and read back the way a timm user reads them), the
config dicts equal timm's key by key and the eval tensors equal timm's to 1e-6 (both resize with PIL and
crop the same pixels; measured difference <= 5e-7, float rounding in the scaling). The training transform
is vitkit's recipe augmentation, so it is compared with `train_transform` under the same seed, and timm's
options the recipes cannot express are refused with one line.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import skimage.data
import timm
import timm.data
import torch
from PIL import Image

import vitkit
import vitkit.data
from vitkit.errors import ConfigError

TOL = 1e-6
PHOTOS = {"chelsea": "jpg", "coffee": "png", "astronaut": "jpg"}  # 451x300, 600x400, 512x512
# (timm name, what its preprocessing exercises); depth=1 keeps both models small, preprocessing is per name
MODELS = [
    ("vit_tiny_patch16_224", "224 px, crop_pct 0.9, bicubic, inception mean/std"),
    ("deit_tiny_patch16_224", "a DeiT: ImageNet mean/std"),
    ("deit3_small_patch16_384", "crop_pct 1.0 at 384 px: the resize alone fills the input"),
    ("vit_base_patch16_224_miil", "bilinear, crop_pct 0.875, raw [0, 1] pixels"),
]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """name -> the photo as a timm user reads it: a file on disk opened with PIL and converted to RGB."""
    d = tmp_path_factory.mktemp("photos")
    images = {}
    for name, ext in PHOTOS.items():
        path = d / f"{name}.{ext}"
        Image.fromarray(getattr(skimage.data, name)()).save(path)
        with Image.open(path) as f:
            images[name] = f.convert("RGB")
    return images


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.mark.parametrize("name,what", MODELS)
def test_config_and_eval_transform_equal_timms_for_the_same_model(photos, name, what):
    ours = vitkit.create_model(name, depth=1)
    theirs = timm.create_model(name, pretrained=False, depth=1)
    cfg = vitkit.data.resolve_data_config(model=ours)
    expect_cfg = timm.data.resolve_data_config(model=theirs)
    assert cfg == expect_cfg, what  # the same keys, the same values
    assert list(cfg) == list(expect_cfg)
    ours_tf, theirs_tf = vitkit.data.create_transform(**cfg), timm.data.create_transform(**expect_cfg)
    for image in photos.values():
        got, expect = ours_tf(image), theirs_tf(image)
        assert got.shape == (3, *cfg["input_size"][1:])
        assert _max_diff(got, expect) <= TOL, (name, image.size)


def test_a_timm_model_and_a_preprocess_resolve_like_timm():
    theirs = timm.create_model("vit_base_patch16_clip_384", pretrained=False, depth=1)  # squash, crop_pct 1.0
    assert vitkit.data.resolve_data_config(model=theirs) == timm.data.resolve_data_config(model=theirs)
    pre = vitkit.create_model("vit_tiny_patch16_224", depth=1).preprocess
    cfg = vitkit.data.resolve_data_config(pretrained_cfg=pre)  # a vitkit Preprocess is a pretrained_cfg
    assert cfg == {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": tuple(pre.mean),
                   "std": tuple(pre.std), "crop_pct": 0.9, "crop_mode": "center"}


@pytest.mark.parametrize("args", [
    {"img_size": 160, "crop_pct": 1.0, "interpolation": "bilinear"},
    {"input_size": (1, 96, 128), "mean": (0.5,), "std": (0.25,)},  # 1 value: repeated per channel
    {"in_chans": 1, "img_size": 64, "crop_mode": "squash"},
    {"chans": 3, "mean": (0.1, 0.2, 0.3), "std": (0.3, 0.2, 0.1), "crop_mode": "border"},
])
def test_args_override_the_model_by_timms_rules(args):
    ours = vitkit.create_model("deit_tiny_patch16_224", depth=1)
    theirs = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=1)
    assert vitkit.data.resolve_data_config(args, model=ours) == timm.data.resolve_data_config(args, model=theirs)


def test_pretrained_cfg_test_size_and_defaults_like_timm():
    pretrained_cfg = {"input_size": (3, 224, 224), "test_input_size": (3, 288, 288), "crop_pct": 0.95,
                      "test_crop_pct": 1.0, "interpolation": "bilinear", "mean": (0.5, 0.5, 0.5),
                      "std": (0.5, 0.5, 0.5), "crop_mode": "center"}
    for use_test_size in (False, True):
        got = vitkit.data.resolve_data_config(pretrained_cfg=pretrained_cfg, use_test_size=use_test_size)
        assert got == timm.data.resolve_data_config(pretrained_cfg=pretrained_cfg, use_test_size=use_test_size)
    assert vitkit.data.resolve_data_config(pretrained_cfg=pretrained_cfg, use_test_size=True)["crop_pct"] == 1.0
    args = {"input_size": (3, 192, 256)}  # nothing from a model: timm's defaults (crop_pct 0.875, ImageNet)
    assert vitkit.data.resolve_data_config(args) == timm.data.resolve_data_config(args)


@pytest.mark.parametrize("kw", [
    dict(input_size=224, crop_pct=0.875, interpolation="bilinear"),  # a plain int size, timm's signature defaults
    dict(input_size=(3, 192, 256), crop_pct=1.0, interpolation="bicubic", mean=(0.5,) * 3, std=(0.5,) * 3),
    dict(input_size=(3, 224, 224), crop_pct=0.9, crop_mode="squash", interpolation="bicubic"),
    dict(input_size=(3, 224, 224), crop_pct=0.9, crop_mode="border", interpolation="bilinear"),
    dict(input_size=(3, 160, 160), is_training=True, no_aug=True, interpolation="bicubic"),  # resize + crop
    dict(input_size=200, is_training=True, no_aug=True, interpolation="random"),  # no_aug: random -> bilinear
])
def test_explicit_arguments_give_timms_tensor(photos, kw):
    ours, theirs = vitkit.data.create_transform(**kw), timm.data.create_transform(**kw)
    for image in photos.values():
        assert _max_diff(ours(image), theirs(image)) <= TOL, (kw, image.size)


def test_training_transform_is_the_recipes_augmentation(photos):
    """The same seed gives the same tensor as the trainer's `train_transform` for the recipe the timm
    arguments name: RandomResizedCrop (scale), flip, RandAugment / TrivialAugment, RandomErasing."""
    from vitkit.data.transforms import train_transform
    from vitkit.training.recipes import Recipe

    model = vitkit.create_model("deit_tiny_patch16_224", depth=1)
    cfg = vitkit.data.resolve_data_config(model=model)
    cases = [
        (dict(scale=(0.35, 1.0), hflip=0.5, color_jitter=None), Recipe(crop="rrc", crop_scale=0.35, hflip=0.5)),
        (dict(scale=(0.5, 1.0), hflip=0.0, auto_augment="rand", re_prob=0.25),
         Recipe(crop="rrc", crop_scale=0.5, hflip=0.0, auto_augment="rand", reprob=0.25)),
        (dict(hflip=0.5, auto_augment="trivial"), Recipe(crop="rrc", crop_scale=0.08, hflip=0.5, auto_augment="trivial")),
    ]
    image = photos["chelsea"]
    for timm_args, recipe in cases:
        ours = vitkit.data.create_transform(**cfg, is_training=True, **timm_args)
        recipes = train_transform(model.preprocess, recipe)
        outs = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            got = ours(image)
            torch.manual_seed(seed)
            expect = recipes(image)
            assert got.shape == (3, 224, 224) and torch.equal(got, expect), timm_args
            outs.append(got)
        assert not torch.equal(*outs)  # random: another seed, another crop


def test_training_defaults_are_timms(photos):
    """timm's defaults: RandomResizedCrop scale (0.08, 1), flip 0.5, ColorJitter 0.4 when no auto-augment."""
    cfg = vitkit.data.resolve_data_config(model=vitkit.create_model("deit_tiny_patch16_224", depth=1))
    default = vitkit.data.create_transform(**cfg, is_training=True)
    names = [type(t).__name__ for t in default.transforms]
    assert "RandomResizedCrop" in names and "RandomHorizontalFlip" in names and "ColorJitter" in names
    crop = next(t for t in default.transforms if type(t).__name__ == "RandomResizedCrop")
    jitter = next(t for t in default.transforms if type(t).__name__ == "ColorJitter")
    assert crop.scale == (0.08, 1.0) and jitter.brightness == (0.6, 1.4) and jitter.hue is None
    no_jitter = vitkit.data.create_transform(**cfg, is_training=True, color_jitter=None)
    torch.manual_seed(0)
    a = default(photos["coffee"])
    torch.manual_seed(0)
    b = no_jitter(photos["coffee"])
    assert a.shape == b.shape == (3, 224, 224) and not torch.equal(a, b)  # the jitter changed the pixels
    with_aa = vitkit.data.create_transform(**cfg, is_training=True, auto_augment="rand")
    assert "ColorJitter" not in [type(t).__name__ for t in with_aa.transforms]  # timm: off with auto-augment


@pytest.mark.parametrize("kw,words", [
    (dict(is_training=True, auto_augment="rand-m9-mstd0.5-inc1"), "auto_augment"),
    (dict(is_training=True, re_mode="pixel", re_prob=0.25), "re_mode"),
    (dict(is_training=True, vflip=0.5), "vflip"),
    (dict(is_training=True, interpolation="random"), "random"),
    (dict(is_training=True, train_crop_mode="rkrc"), "train_crop_mode"),
    (dict(is_training=True, scale=(0.08, 0.5)), "scale"),
    (dict(interpolation="lanczos"), "interpolation"),
    (dict(crop_mode="zoom"), "crop_mode"),
    (dict(normalize=False), "normalize"),
    (dict(separate=True), "separate"),
])
def test_options_vitkit_does_not_have_are_one_clear_line(kw, words):
    with pytest.raises(ConfigError) as e:
        vitkit.data.create_transform(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bad_configs_are_one_clear_line():
    with pytest.raises(ConfigError, match="model, args or pretrained_cfg"):
        vitkit.data.resolve_data_config()
    with pytest.raises(ConfigError, match="mean"):
        vitkit.data.resolve_data_config({"input_size": (3, 32, 32), "mean": (0.5, 0.5)})
    with pytest.raises(ConfigError, match="input_size"):
        vitkit.data.resolve_data_config({"input_size": (32, 32)})


def test_both_names_load_lazily_from_vitkit_data():
    """`import vitkit.data` stays light (no torchvision, checked in a fresh interpreter) until a name is used."""
    code = "import sys, vitkit.data\nassert 'torchvision' not in sys.modules, 'imported eagerly'\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    from vitkit.data import create_transform, resolve_data_config
    from vitkit.data.transforms import create_transform as defined
    from vitkit.data.transforms import resolve_data_config as resolved

    assert create_transform is defined and resolve_data_config is resolved
    assert {"create_transform", "resolve_data_config"} <= set(dir(vitkit.data)) and vitkit.data.__all__
