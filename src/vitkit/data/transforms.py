"""Train and eval pipelines from torchvision.transforms.v2, driven by a recipe and a model's `preprocess`.

Inputs are uint8 tensors [C, H, W] (built-in sets) or PIL images (user files); outputs are normalised
float tensors [C, H, W] at the model's input size with the model's channel count.
"""
from __future__ import annotations

import math

import torch
from torchvision.transforms import InterpolationMode, v2

_INTERP = {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR,
           "nearest": InterpolationMode.NEAREST}


class MatchChannels(torch.nn.Module):
    """Gray data into a 3-channel (pretrained) model and the reverse; a no-op when they already match."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.convert = v2.RGB() if channels == 3 else v2.Grayscale(num_output_channels=1)

    def forward(self, img):
        return img if img.shape[-3] == self.channels else self.convert(img)


def _channels(channels: int) -> list:
    return [MatchChannels(channels)]


def _size(pre) -> tuple[int, int]:
    return int(pre.input_size[1]), int(pre.input_size[2])


def eval_transform(pre) -> v2.Compose:
    """Resize so that the centre crop of `crop_pct` fills the input, then centre-crop (timm's eval)."""
    h, w = _size(pre)
    interp = _INTERP.get(pre.interpolation, InterpolationMode.BICUBIC)
    scale = (math.floor(h / pre.crop_pct), math.floor(w / pre.crop_pct))
    return v2.Compose([
        v2.ToImage(), *_channels(pre.input_size[0]),
        v2.Resize(scale, interpolation=interp, antialias=True), v2.CenterCrop((h, w)),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(pre.mean), list(pre.std)),
    ])


def train_transform(pre, recipe, src_size: tuple[int, int] | None = None) -> v2.Compose:
    """Augmentations named by the recipe: crop (rrc | pad | none), flip, RandAugment / TrivialAugment,
    then normalisation and RandomErasing."""
    h, w = _size(pre)
    interp = _INTERP.get(pre.interpolation, InterpolationMode.BICUBIC)
    ops: list = [v2.ToImage(), *_channels(pre.input_size[0])]
    if recipe.crop == "rrc":
        ops.append(v2.RandomResizedCrop((h, w), scale=(recipe.crop_scale, 1.0), interpolation=interp,
                                        antialias=True))
    else:
        if src_size is None or tuple(src_size) != (h, w):  # built-in sets already at the model's size skip it
            ops.append(v2.Resize((h, w), interpolation=interp, antialias=True))
        if recipe.crop == "pad" and recipe.crop_padding:
            ops.append(v2.RandomCrop((h, w), padding=recipe.crop_padding))
    if recipe.hflip:
        ops.append(v2.RandomHorizontalFlip(recipe.hflip))
    aug_interp = InterpolationMode.BILINEAR if interp == InterpolationMode.BICUBIC else interp  # affine ops on tensors
    if recipe.auto_augment == "rand":
        ops.append(v2.RandAugment(num_ops=recipe.ra_num_ops, magnitude=recipe.ra_magnitude, interpolation=aug_interp))
    elif recipe.auto_augment == "trivial":
        ops.append(v2.TrivialAugmentWide(interpolation=aug_interp))
    ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(pre.mean), list(pre.std))]
    if recipe.reprob:
        ops.append(v2.RandomErasing(p=recipe.reprob, value=0))
    return v2.Compose(ops)


def batch_mixer(recipe, num_classes: int):
    """MixUp / CutMix on a batch (one of them per batch), or None. Targets become soft [B, K]."""
    mixers = []
    if recipe.mixup > 0:
        mixers.append(v2.MixUp(alpha=recipe.mixup, num_classes=num_classes))
    if recipe.cutmix > 0:
        mixers.append(v2.CutMix(alpha=recipe.cutmix, num_classes=num_classes))
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)
