"""vitkit's eval transform is timm's: the same tensor as `timm.data.create_transform(**resolve_data_config(...))`
on real, non-square photos (skimage.data) read back from PNG and JPEG files.

Tolerance: 1e-5. Both resize the PIL image with PIL and crop the same pixels, so the only difference left
is float rounding in the [0, 1] scaling and normalisation (measured: <= 5e-7)."""
from __future__ import annotations

import itertools
import types

import pytest
import skimage.data
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

import vitkit
from vitkit.data.images import load_image
from vitkit.data.transforms import eval_resize_size, eval_transform
from vitkit.models.config import Preprocess

TOL = 1e-5
PHOTOS = {"chelsea": "jpg", "coffee": "png", "astronaut": "jpg"}  # 451x300, 600x400, 512x512


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    d = tmp_path_factory.mktemp("photos")
    paths = {}
    for name, ext in PHOTOS.items():
        paths[name] = d / f"{name}.{ext}"
        Image.fromarray(getattr(skimage.data, name)()).save(paths[name])
    return paths


def timm_tensor(pre, image, crop_mode=None):
    args = {"input_size": tuple(pre.input_size), "crop_pct": pre.crop_pct, "interpolation": pre.interpolation,
            "mean": tuple(pre.mean), "std": tuple(pre.std)}
    if crop_mode:
        args["crop_mode"] = crop_mode
    cfg = resolve_data_config(args)
    assert cfg["crop_pct"] == pre.crop_pct and cfg["input_size"] == tuple(pre.input_size)
    return create_transform(**cfg)(image)


SETTINGS = list(itertools.product((0.875, 0.9, 1.0), ("bicubic", "bilinear"), ((224, 224), (192, 256))))


@pytest.mark.parametrize("name", list(PHOTOS))
@pytest.mark.parametrize("crop_pct,interp,size", SETTINGS)
def test_eval_transform_equals_timm_on_photo_files(photos, name, crop_pct, interp, size):
    pre = Preprocess(mean=(0.5, 0.45, 0.4), std=(0.25, 0.22, 0.2), interpolation=interp, crop_pct=crop_pct,
                     input_size=(3, *size))
    image = load_image(photos[name], 3)  # what predict reads
    with Image.open(photos[name]) as f:
        reference = f.convert("RGB")  # what a timm user reads
    expect = timm_tensor(pre, reference)
    got = eval_transform(pre)(image)
    assert got.shape == expect.shape == (3, *size) and got.dtype == torch.float32
    assert (got - expect).abs().max().item() <= TOL


def test_shorter_side_is_scaled_and_aspect_ratio_kept():
    pre = Preprocess(interpolation="bicubic", crop_pct=0.875, input_size=(3, 224, 224))
    assert eval_resize_size((300, 451), pre) == (256, 384)  # chelsea: short side 256, int(256 * 451 / 300)
    assert eval_resize_size((451, 300), pre) == (384, 256)
    assert eval_resize_size((512, 512), pre) == (256, 256)
    wide = Preprocess(crop_pct=1.0, input_size=(3, 192, 256))  # non-square: the smaller ratio, rounded
    assert eval_resize_size((400, 600), wide) == (192, 288)
    assert eval_resize_size((300, 451), wide) == (192, 289)  # round(451 * 192 / 300) = round(288.64)


@pytest.mark.parametrize("mode", ["squash", "border", "center"])
def test_timm_crop_modes_when_the_preprocess_names_one(photos, mode):
    pre = types.SimpleNamespace(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bicubic", crop_pct=0.9,
                                input_size=(3, 224, 224), crop_mode=mode)
    image = load_image(photos["coffee"], 3)
    expect = timm_tensor(pre, image, crop_mode=mode)
    assert (eval_transform(pre)(image) - expect).abs().max().item() <= TOL


def test_gray_model_on_colour_photo_is_timm_on_the_gray_image(photos):
    pre = Preprocess(mean=(0.5,), std=(0.5,), interpolation="bilinear", crop_pct=0.875, input_size=(1, 64, 64))
    rgb = load_image(photos["chelsea"], 3)
    got = eval_transform(pre)(rgb)  # MatchChannels: colour into a 1-channel model
    assert got.shape == (1, 64, 64)
    expect = timm_tensor(pre, rgb.convert("L"))
    assert (got - expect).abs().max().item() <= TOL
    pre3 = Preprocess(crop_pct=1.0, input_size=(3, 32, 32))  # and gray into a 3-channel model
    gray = load_image(photos["chelsea"], 1)
    assert (eval_transform(pre3)(gray) - timm_tensor(pre3, gray.convert("RGB"))).abs().max().item() <= TOL


def test_uint8_tensor_input_has_the_same_geometry(photos):
    """Built-in datasets hand tensors over: torchvision's antialiased tensor resize, same size and crop;
    it differs from PIL's by at most a few uint8 levels per pixel (here <= 3 / 255 / std)."""
    from torchvision.transforms.v2.functional import pil_to_tensor

    pre = Preprocess(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bilinear", crop_pct=0.875,
                     input_size=(3, 96, 96))
    image = load_image(photos["chelsea"], 3)
    from_pil, from_tensor = eval_transform(pre)(image), eval_transform(pre)(pil_to_tensor(image))
    assert from_tensor.shape == from_pil.shape == (3, 96, 96)
    assert (from_tensor - from_pil).abs().max().item() <= 3 / 255 / 0.5 + 1e-6
    assert (from_tensor - from_pil).abs().mean().item() < 0.01


def test_predict_scores_what_timm_would_feed_the_model(photos):
    """End to end: `predict_files` on a non-square JPEG gives the probabilities of the model on timm's tensor."""
    from vitkit.inference import predict_files

    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, num_classes=7).eval()
    assert model.preprocess.crop_pct != 1.0  # the default ViT preprocessing crops
    preds, errors = predict_files(model, [photos["chelsea"]], top_k=7)
    assert errors == []
    with Image.open(photos["chelsea"]) as f:
        x = timm_tensor(model.preprocess, f.convert("RGB"))[None]
    with torch.no_grad():
        expect = model(x).softmax(-1)[0]
    for t in preds[0]["top"]:
        assert t["prob"] == pytest.approx(float(expect[t["index"]]), abs=1e-5)
