"""Train and eval pipelines from torchvision.transforms.v2, driven by a recipe and a model's `preprocess`.

Inputs are uint8 tensors [C, H, W] (built-in sets) or PIL images (user files); outputs are normalised
float tensors [C, H, W] at the model's input size with the model's channel count.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as TF

_INTERP = {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR,
           "nearest": InterpolationMode.NEAREST}


class MatchChannels(torch.nn.Module):
    """Gray data into a 3-channel (pretrained) model and the reverse; a no-op when they already match.
    Works on PIL images (converted with PIL) and on tensors [..., C, H, W]."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.convert = v2.RGB() if channels == 3 else v2.Grayscale(num_output_channels=1)

    def forward(self, img):
        if isinstance(img, Image.Image):
            mode = "RGB" if self.channels == 3 else "L"
            return img if img.mode == mode else img.convert(mode)
        return img if img.shape[-3] == self.channels else self.convert(img)


def _channels(channels: int) -> list:
    return [MatchChannels(channels)]


def _size(pre) -> tuple[int, int]:
    return int(pre.input_size[1]), int(pre.input_size[2])


CROP_MODES = ("center", "squash", "border")


def eval_resize_size(image_hw: tuple[int, int], pre) -> tuple[int, int]:
    """(H, W) an image of size `image_hw` is resized to before the eval crop, by timm's rule
    (`timm.data.transforms_factory.transforms_imagenet_eval`):

    the scale size is floor(side / crop_pct) per side of the input size; crop_mode 'center' (the default)
    keeps the aspect ratio: for a square scale size the SHORTER side becomes it and the longer side is
    int(s * long / short) (torchvision's Resize(int), truncation); for a non-square one the image is scaled
    by the smaller of the two side ratios with round() (timm's ResizeKeepRatio). 'squash' resizes to the
    scale size itself (aspect ratio lost); 'border' fits the LONGER side (ResizeKeepRatio(longest=1)).
    """
    h, w = (int(v) for v in image_hw)
    th, tw = _size(pre)
    sh, sw = math.floor(th / pre.crop_pct), math.floor(tw / pre.crop_pct)
    mode = crop_mode_of(pre)
    if mode == "squash":
        return sh, sw
    if mode == "center" and sh == sw:
        short, long = min(h, w), max(h, w)
        new_short, new_long = sh, int(sh * long / short)
        return (new_short, new_long) if h <= w else (new_long, new_short)
    rh, rw = h / sh, w / sw
    ratio = max(rh, rw) if mode == "border" else min(rh, rw)
    return round(h / ratio), round(w / ratio)


def crop_mode_of(pre) -> str:
    """The preprocessing's crop mode (a `crop_mode` field when it has one, else timm's default 'center')."""
    mode = getattr(pre, "crop_mode", None) or "center"
    if mode not in CROP_MODES:
        raise ValueError(f"crop_mode must be one of {', '.join(CROP_MODES)}, got {mode!r}")
    return mode


class EvalResizeCrop(torch.nn.Module):
    """timm's eval geometry: resize by `eval_resize_size`, then centre-crop to the input size ('border'
    pads the short side with the mean colour first). PIL images are resized by PIL, exactly as timm does;
    tensors by torchvision's antialiased tensor resize."""

    def __init__(self, pre, interpolation: InterpolationMode | None = None):
        super().__init__()
        self.pre = pre
        self.interpolation = interpolation or _INTERP.get(pre.interpolation, InterpolationMode.BICUBIC)
        self.mode = crop_mode_of(pre)
        self.fill = [round(255 * v) for v in pre.mean]

    def forward(self, img):
        h, w = TF.get_size(img)
        size = list(eval_resize_size((h, w), self.pre))
        if size != [h, w]:
            img = TF.resize(img, size, interpolation=self.interpolation, antialias=True)
        th, tw = _size(self.pre)
        if self.mode == "border":
            h, w = size
            if th > h or tw > w:
                pad_w, pad_h = max(tw - w, 0), max(th - h, 0)
                fill = self.fill if len(self.fill) == TF.get_num_channels(img) else self.fill[0]
                if isinstance(img, Image.Image):
                    fill = tuple(fill) if isinstance(fill, list) else fill
                img = TF.pad(img, [pad_w // 2, pad_h // 2, (pad_w + 1) // 2, (pad_h + 1) // 2], fill=fill)
        return TF.center_crop(img, [th, tw])


def eval_transform(pre) -> v2.Compose:
    """timm's eval transform for `pre` (`timm.data.create_transform(**resolve_data_config(...))`): resize so
    that the centre crop of `crop_pct` fills the input, keeping the aspect ratio (the shorter side is
    scaled), centre-crop, scale to [0, 1], normalise. PIL images give the same tensor as timm's transform
    (to float rounding); the channel count is matched to the model's first."""
    return v2.Compose([
        *_channels(pre.input_size[0]), EvalResizeCrop(pre), v2.ToImage(),
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


# how much larger than the model's input an image may be (shorter-side ratio) before `conversion_note` says so
LARGE_INPUT_RATIO = 4.0


def conversion_note(pre, sources, trained_on: str | None = None) -> str | None:
    """One line saying what the images became when they differ from what the model was trained on, or None.

    `sources` are (name, (width, height, channels, mode) or None) pairs (`data.images.image_source`). An
    image counts when its channel count differs from the model's or it is more than LARGE_INPUT_RATIO times
    the model's input on both sides (a photo into a 28x28 model); matching data gives no note.
    """
    c, h, w = (int(v) for v in pre.input_size)
    odd = [(name, s) for name, s in sources
           if s is not None and (s[2] != c or min(s[0] / w, s[1] / h) > LARGE_INPUT_RATIO)]
    if not odd:
        return None
    name, (sw, sh, sc, _) = odd[0]
    more = f"; {len(odd) - 1} more image{'s' if len(odd) > 2 else ''} likewise" if len(odd) > 1 else ""
    on = f" on {trained_on}" if trained_on else ""
    return (f"note: images are converted to {c}-channel {h}x{w} as the model was trained{on} "
            f"({Path(str(name)).name} was {sw}x{sh} {'RGB' if sc == 3 else 'grayscale'}{more})")
