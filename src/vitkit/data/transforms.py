"""Train and eval pipelines from torchvision.transforms.v2, driven by a recipe and a model's `preprocess`.

Inputs are uint8 tensors [C, H, W] (built-in sets) or PIL images (user files); outputs are normalised
float tensors [C, H, W] at the model's input size with the model's channel count.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import types
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as TF

from ..errors import ConfigError
from ..layers.naflex import ImagePatches, grid_for_budget, image_patches, pad_patches

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


class TokenBudgetResize(torch.nn.Module):
    """Resize keeping the aspect ratio to the largest grid of `patch`-pixel patches with at most `max_tokens`
    (layers/naflex.grid_for_budget; each side a whole number of patches, as timm's NaFlex transforms)."""

    def __init__(self, patch: int, max_tokens: int, interpolation: str = "bicubic"):
        super().__init__()
        self.patch, self.max_tokens = int(patch), int(max_tokens)
        self.interpolation = _INTERP.get(interpolation, InterpolationMode.BICUBIC)

    def forward(self, img):
        h, w = TF.get_size(img)
        gh, gw = grid_for_budget(h, w, self.patch, self.max_tokens)
        size = [gh * self.patch, gw * self.patch]
        return img if size == [h, w] else TF.resize(img, size, interpolation=self.interpolation, antialias=True)


class ToPatches(torch.nn.Module):
    """A normalised image [C, Gh*P, Gw*P] -> ImagePatches (its patches [Gh*Gw, C*P*P] and grid)."""

    def __init__(self, patch: int):
        super().__init__()
        self.patch = int(patch)

    def forward(self, img: torch.Tensor) -> ImagePatches:
        return image_patches(img, self.patch)


def native_aspect(pre) -> bool:
    """Whether `pre` feeds images at their own aspect ratio under a token budget (NaFlex) instead of a crop."""
    return bool(getattr(pre, "max_tokens", 0))


def stack_inputs(items: list):
    """Transformed images -> one model input: [B, C, H, W], or a padded PatchBatch of ImagePatches (NaFlex)."""
    if items and isinstance(items[0], ImagePatches):
        return pad_patches(items)
    return torch.stack(items)


def collate(batch: list):
    """The loaders' collate: torch's default, except that ImagePatches (the first field of each item, or the items
    themselves) become one padded PatchBatch."""
    first = batch[0]
    if isinstance(first, ImagePatches):
        return stack_inputs(batch)
    if isinstance(first, (tuple, list)) and first and isinstance(first[0], ImagePatches):
        return (stack_inputs([b[0] for b in batch]), *default_collate([tuple(b[1:]) for b in batch]))
    return default_collate(batch)


def blank_input(pre):
    """What stands in for an image that failed to load (zeros; flagged by the caller): [C, H, W], or one patch."""
    c, h, w = (int(v) for v in pre.input_size)
    if native_aspect(pre):
        return ImagePatches(torch.zeros(1, c * pre.token_patch ** 2), (1, 1), pre.token_patch)
    return torch.zeros(c, h, w)


def eval_transform(pre) -> v2.Compose:
    """timm's eval transform for `pre` (`timm.data.create_transform(**resolve_data_config(...))`): resize so
    that the centre crop of `crop_pct` fills the input, keeping the aspect ratio (the shorter side is
    scaled), centre-crop, scale to [0, 1], normalise. PIL images give the same tensor as timm's transform
    (to float rounding); the channel count is matched to the model's first.

    With `max_tokens` (NaFlex) no crop: the whole image, resized keeping its aspect ratio to the largest patch
    grid within the budget (`TokenBudgetResize`), normalised and cut into ImagePatches; `collate` pads them."""
    if native_aspect(pre):
        return v2.Compose([
            *_channels(pre.input_size[0]), v2.ToImage(),
            TokenBudgetResize(pre.token_patch, pre.max_tokens, pre.interpolation),
            v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(pre.mean), list(pre.std)), ToPatches(pre.token_patch),
        ])
    return v2.Compose([
        *_channels(pre.input_size[0]), EvalResizeCrop(pre), v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(pre.mean), list(pre.std)),
    ])


def train_transform(pre, recipe, src_size: tuple[int, int] | None = None,
                    color_jitter: tuple[float, ...] | None = None) -> v2.Compose:
    """Augmentations named by the recipe: crop (rrc | pad | none), flip, RandAugment / TrivialAugment,
    then normalisation and RandomErasing. `recipe` is a training Recipe or any object with its augmentation
    fields (crop, crop_scale, crop_padding, hflip, auto_augment, ra_num_ops, ra_magnitude, reprob).

    `color_jitter` (brightness, contrast, saturation[, hue] factors, after the auto-augment as in timm) is
    not a recipe field: only `create_transform` sets it, for timm's default jitter.

    With `max_tokens` in `pre` (NaFlex): `BudgetTrainTransform`, the same augmentations at the image's own
    aspect ratio."""
    if native_aspect(pre):
        return BudgetTrainTransform(pre, recipe, color_jitter)
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
    return v2.Compose(ops + _augment_and_normalise(pre, recipe, interp, color_jitter))


def _augment_and_normalise(pre, recipe, interp: InterpolationMode, color_jitter) -> list:
    """What follows the crop in training: flip, auto-augment, jitter, then normalisation and RandomErasing."""
    ops: list = []
    if recipe.hflip:
        ops.append(v2.RandomHorizontalFlip(recipe.hflip))
    aug_interp = InterpolationMode.BILINEAR if interp == InterpolationMode.BICUBIC else interp  # affine ops on tensors
    if recipe.auto_augment == "rand":
        ops.append(v2.RandAugment(num_ops=recipe.ra_num_ops, magnitude=recipe.ra_magnitude, interpolation=aug_interp))
    elif recipe.auto_augment == "trivial":
        ops.append(v2.TrivialAugmentWide(interpolation=aug_interp))
    if color_jitter is not None and any(color_jitter):
        ops.append(v2.ColorJitter(*color_jitter))
    ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(pre.mean), list(pre.std))]
    if recipe.reprob:
        ops.append(v2.RandomErasing(p=recipe.reprob, value=0))
    return ops


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic): well-mixed bits from consecutive seeds."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def seeded_uniforms(seeds, stream: int, count: int | None = None) -> torch.Tensor:
    """Uniform draws in [0, 1) (float64), a pure function of (seed, stream): the batched transforms' randomness,
    so a sample's augmentation does not depend on the batch it is drawn in. One per seed [B]; with `count`,
    that many per seed [B, count] (SplitMix64's sequence from the same state: draw 0 is the single draw)."""
    with np.errstate(over="ignore"):
        state = np.asarray(seeds, dtype=np.uint64) * np.uint64(8) + np.uint64(stream)  # [B]
        if count is not None:
            state = state[:, None] + np.arange(count, dtype=np.uint64)[None, :] * _GOLDEN_GAMMA  # [B, count]
        bits = _splitmix64(state)
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) / float(2 ** 53))


def erase_boxes(seeds, p: float, size: tuple[int, int], scale=(0.02, 0.33), ratio=(0.3, 3.3)) -> torch.Tensor:
    """Where v2.RandomErasing(p, scale, ratio) erases, for a batch at once -> a mask [B, 1, H, W] (True: erased).
    The same draw as torchvision's: with probability p, up to 10 tries of an area (a `scale` fraction of the
    image) and a log-uniform aspect ratio; the first box that fits (h < H and w < W) at a uniform offset, none if
    no try fits. Each sample's draws come from its seed (streams 3 and 4)."""
    height, width = size
    erase = seeded_uniforms(seeds, 3) < p  # [B]
    u = seeded_uniforms(seeds, 4, 40).view(-1, 10, 4)  # [B, tries, (area, ratio, top, left)]
    area = height * width * (scale[0] + (scale[1] - scale[0]) * u[..., 0])  # [B, 10]
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[..., 1])
    h = torch.round(torch.sqrt(area * aspect)).long()  # round half to even, as Python's round
    w = torch.round(torch.sqrt(area / aspect)).long()
    fits = (h < height) & (w < width)  # [B, 10]
    first = fits.long().argmax(1, keepdim=True)  # the first try that fits [B, 1]
    erase &= fits.any(1)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]  # [B]
    top = (u[..., 2].gather(1, first)[:, 0] * (height - h + 1)).long()  # uniform in [0, H - h]
    left = (u[..., 3].gather(1, first)[:, 0] * (width - w + 1)).long()
    rows, cols = torch.arange(height), torch.arange(width)
    in_rows = (rows[None] >= top[:, None]) & (rows[None] < (top + h)[:, None])  # [B, H]
    in_cols = (cols[None] >= left[:, None]) & (cols[None] < (left + w)[:, None])  # [B, W]
    return (erase[:, None, None] & in_rows[:, :, None] & in_cols[:, None, :])[:, None]  # [B, 1, H, W]


class BatchedTransform:
    """A train or eval pipeline on a whole uint8 batch [B, C, H, W] at once, for in-memory images already at the
    model's input size: channel matching, the recipe's pad-crop and flip (each sample's own draw from its seed),
    scaling and normalisation, then random erasing, with no per-image Python. Built by `batched_train_transform` /
    `batched_eval_transform` only where every op of the per-image pipeline has a batched form; it replaces the
    per-image pipeline for those datasets (data.datasets.Transformed), it does not reproduce its random draws.

    Why: the per-image v2 pipeline costs ~100 us an image on a 2-core Zen 4, 8% on top of a small ViT's training
    step; the batched form 0.4% (BENCHMARKS.md, "Per image against batched")."""

    def __init__(self, pre, hflip: float = 0.0, crop_padding: int = 0, reprob: float = 0.0):
        self.channels = int(pre.input_size[0])
        self.hflip, self.pad, self.reprob = float(hflip), int(crop_padding), float(reprob)
        self.mean = torch.tensor(pre.mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(pre.std, dtype=torch.float32).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor, seeds) -> torch.Tensor:
        x = images  # [B, C, H, W] uint8
        if x.shape[1] != self.channels:  # as MatchChannels: torchvision's own conversions, batched
            x = TF.grayscale_to_rgb(x) if self.channels == 3 else TF.rgb_to_grayscale(x)
        b, _, h, w = x.shape
        if self.pad:  # v2.RandomCrop(padding=p): zero padding, then an (H, W) window at a random offset
            x = torch.nn.functional.pad(x, [self.pad] * 4)
            span = 2 * self.pad + 1
            dy = (seeded_uniforms(seeds, 1) * span).long()  # [B]
            dx = (seeded_uniforms(seeds, 2) * span).long()
            rows = (dy[:, None] + torch.arange(h))[:, None, :, None]  # [B, 1, H, 1]
            cols = (dx[:, None] + torch.arange(w))[:, None, None, :]  # [B, 1, 1, W]
            x = x[torch.arange(b)[:, None, None, None], torch.arange(x.shape[1])[None, :, None, None], rows, cols]
        if self.hflip:
            flip = seeded_uniforms(seeds, 0) < self.hflip  # [B]
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        x = (x.float() / 255 - self.mean) / self.std  # [B, C, H, W]
        if self.reprob:  # after normalisation, erased to 0 (the mean), as the per-image v2.RandomErasing(value=0)
            x = x.masked_fill(erase_boxes(seeds, self.reprob, (h, w)), 0.0)
        return x


def batched_train_transform(pre, recipe, src_size: tuple[int, int] | None) -> BatchedTransform | None:
    """`train_transform`'s batched form (`BatchedTransform`) where it has one: images at the input size (no
    resize), crop none or pad, no auto-augment; otherwise None (the per-image pipeline)."""
    if native_aspect(pre) or src_size is None or tuple(src_size) != _size(pre):
        return None
    if recipe.crop not in ("none", "pad") or recipe.auto_augment:
        return None
    return BatchedTransform(pre, recipe.hflip, recipe.crop_padding if recipe.crop == "pad" else 0, recipe.reprob)


def batched_eval_transform(pre, src_size: tuple[int, int] | None) -> BatchedTransform | None:
    """`eval_transform`'s batched form where its resize and centre crop leave images of `src_size` as they are;
    otherwise None."""
    if native_aspect(pre) or src_size is None or tuple(src_size) != _size(pre):
        return None
    if tuple(eval_resize_size(src_size, pre)) != tuple(src_size):
        return None
    return BatchedTransform(pre)


class BudgetTrainTransform(torch.nn.Module):
    """NaFlex training (training/token_budget.py): the recipe's crop at the image's own aspect ratio (rrc: a random
    area and aspect-ratio box, as RandomResizedCrop draws it; pad: a padded random crop at the source size), resized
    to the largest patch grid within the step's token budget (`max_tokens`, default the preprocessing's), then the
    recipe's augmentations and normalisation, cut into ImagePatches."""

    def __init__(self, pre, recipe, color_jitter=None):
        super().__init__()
        self.pre, self.recipe = pre, recipe
        interp = _INTERP.get(pre.interpolation, InterpolationMode.BICUBIC)
        self.before = v2.Compose([v2.ToImage(), *_channels(pre.input_size[0])])
        self.after = v2.Compose(_augment_and_normalise(pre, recipe, interp, color_jitter))
        self.to_patches = ToPatches(pre.token_patch)
        self.rrc = v2.RandomResizedCrop(1, scale=(recipe.crop_scale, 1.0)) if recipe.crop == "rrc" else None

    def forward(self, img, max_tokens: int | None = None) -> ImagePatches:
        img = self.before(img)
        h, w = TF.get_size(img)
        if self.rrc is not None:
            box = self.rrc.make_params([img])  # top, left, height, width of a random box (RandomResizedCrop's draw)
            img = TF.crop(img, box["top"], box["left"], box["height"], box["width"])
        elif self.recipe.crop == "pad" and self.recipe.crop_padding:
            img = v2.RandomCrop((h, w), padding=self.recipe.crop_padding)(img)
        img = TokenBudgetResize(self.pre.token_patch, max_tokens or self.pre.max_tokens, self.pre.interpolation)(img)
        return self.to_patches(self.after(img))


# ----------------------------------------------------------------------------------- timm's data API
# timm's defaults (timm.data.constants) for what neither the arguments nor the model say
TIMM_DEFAULT_CROP_PCT = 0.875
TIMM_DEFAULT_CROP_MODE = "center"
TIMM_DEFAULT_INTERPOLATION = "bicubic"
TIMM_DEFAULT_SIZE = 224
TIMM_DEFAULT_SCALE = (0.08, 1.0)  # RandomResizedCrop's area range
TIMM_DEFAULT_RATIO = (3 / 4, 4 / 3)  # and aspect-ratio range (torchvision's own default too)
DATA_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
AUTO_AUGMENTS = ("rand", "trivial")  # the recipes' auto-augment policies (torchvision's)
# timm create_transform options vitkit's pipelines do not have, each with the value that switches it off in
# timm; any other value is refused rather than ignored
_TIMM_OFF_VALUES = {
    "vflip": 0.0, "color_jitter_prob": None, "grayscale_prob": 0.0, "gaussian_blur_prob": 0.0, "re_count": 1,
    "re_num_splits": 0, "crop_border_pixels": None, "tf_preprocessing": False, "use_prefetcher": False,
    "normalize": True, "separate": False, "naflex": False, "patchify": False,
}
# accepted for timm's signature; they only mean something with the NaFlex / patchify options refused above
_TIMM_PATCHIFY_OPTIONS = ("patch_size", "max_seq_len", "patchify_channels_last", "patchify_flatten")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """A resolved data config as an object: the `pre` that eval_transform / train_transform read (a model's
    Preprocess has the same fields, less crop_mode)."""

    input_size: tuple[int, int, int]
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float
    crop_mode: str = TIMM_DEFAULT_CROP_MODE


def _config_source(pretrained_cfg, model) -> dict:
    """timm's pretrained_cfg keys from what the caller gave: a pretrained_cfg dict, a vitkit Preprocess (or
    anything with its fields), else the model's own: a vitkit model's (or ONNX runner's) `preprocess`, a timm
    model's `pretrained_cfg`."""
    source = pretrained_cfg
    if not source and model is not None:
        source = getattr(model, "preprocess", None) or getattr(model, "pretrained_cfg", None)
    if not source:
        return {}
    if isinstance(source, Mapping):
        return dict(source)
    if hasattr(source, "input_size") and hasattr(source, "mean"):  # a Preprocess or a DataConfig
        return {k: getattr(source, k, None) for k in DATA_CONFIG_KEYS}
    raise ConfigError(f"pretrained_cfg must be a dict or a Preprocess, got {type(source).__name__}")


def _per_channel(name: str, values, in_chans: int) -> tuple[float, ...]:
    values = tuple(float(v) for v in values)
    if len(values) == 1:
        return values * in_chans
    if len(values) != in_chans:
        raise ConfigError(f"{name} has {len(values)} values for {in_chans} input channels (give 1 or {in_chans})")
    return values


def resolve_data_config(args=None, pretrained_cfg=None, model=None, use_test_size: bool = False,
                        verbose: bool = False) -> dict:
    """timm's `resolve_data_config`, with its arguments and rules: {input_size, interpolation, mean, std,
    crop_pct, crop_mode} for `create_transform(**config)`.

    Each value comes from `args` (a dict or argparse namespace with timm's keys: input_size, img_size,
    in_chans/chans, interpolation, mean, std, crop_pct, crop_mode) when given there, else from
    `pretrained_cfg` (a timm pretrained_cfg dict or a vitkit Preprocess), else from the model (a vitkit
    model's `preprocess`, a timm model's `pretrained_cfg`), else timm's default. `use_test_size` takes a
    pretrained_cfg's test_input_size / test_crop_pct when it has them.
    """
    if model is None and not args and not pretrained_cfg:
        raise ConfigError("resolve_data_config needs a model, args or pretrained_cfg (as timm's does)")
    args = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    source = _config_source(pretrained_cfg, model)
    in_chans = next((args[k] for k in ("in_chans", "chans") if args.get(k) is not None), 3)

    if args.get("input_size") is not None:
        if not isinstance(args["input_size"], (tuple, list)) or len(args["input_size"]) != 3:
            raise ConfigError(f"input_size must be (channels, height, width), got {args['input_size']!r}")
        input_size = tuple(int(v) for v in args["input_size"])
        in_chans = input_size[0]  # input_size overrides in_chans, as in timm
    elif args.get("img_size") is not None:
        if not isinstance(args["img_size"], int):
            raise ConfigError(f"img_size must be one whole number (input_size takes (C, H, W)), got {args['img_size']!r}")
        input_size = (in_chans, args["img_size"], args["img_size"])
    elif use_test_size and source.get("test_input_size") is not None:
        input_size = tuple(source["test_input_size"])
    elif source.get("input_size") is not None:
        input_size = tuple(source["input_size"])
    else:
        input_size = (in_chans, TIMM_DEFAULT_SIZE, TIMM_DEFAULT_SIZE)

    from ..models.config import IMAGENET_MEAN, IMAGENET_STD

    stats = {}
    for key, default in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
        if args.get(key) is not None:
            stats[key] = _per_channel(key, args[key], in_chans)
        else:
            stats[key] = tuple(source.get(key) or default)

    if args.get("crop_pct"):
        crop_pct = args["crop_pct"]
    elif use_test_size and source.get("test_crop_pct"):
        crop_pct = source["test_crop_pct"]
    else:
        crop_pct = source.get("crop_pct") or TIMM_DEFAULT_CROP_PCT

    config = {
        "input_size": input_size,
        "interpolation": args.get("interpolation") or source.get("interpolation") or TIMM_DEFAULT_INTERPOLATION,
        "mean": stats["mean"], "std": stats["std"], "crop_pct": crop_pct,
        "crop_mode": args.get("crop_mode") or source.get("crop_mode") or TIMM_DEFAULT_CROP_MODE,
    }
    if verbose:
        logging.getLogger(__name__).info("data config: %s", ", ".join(f"{k}={v}" for k, v in config.items()))
    return config


def _refuse(option: str, why: str) -> NoReturn:
    raise ConfigError(f"create_transform: {option} {why}")


def _check_timm_options(options: dict) -> None:
    """Refuse the timm options vitkit's pipelines do not implement, unless they hold timm's 'off' value."""
    for name, value in options.items():
        if name in _TIMM_PATCHIFY_OPTIONS:
            continue
        if name not in _TIMM_OFF_VALUES:
            raise TypeError(f"create_transform() got an unexpected keyword argument {name!r}")
        if value != _TIMM_OFF_VALUES[name]:
            _refuse(f"{name}={value!r}", f"is not supported by vitkit's transforms (only timm's default, "
                    f"{_TIMM_OFF_VALUES[name]!r}); build that pipeline with timm itself")


def _interpolation(name: str) -> str:
    if name not in _INTERP:
        _refuse(f"interpolation={name!r}", f"is not one of vitkit's: {', '.join(_INTERP)}")
    return name


def _color_jitter(color_jitter) -> tuple[float, ...] | None:
    """timm's color_jitter argument as ColorJitter factors: a scalar is (s, s, s) (no hue)."""
    if color_jitter is None:
        return None
    if isinstance(color_jitter, (tuple, list)):
        if len(color_jitter) not in (3, 4):
            _refuse(f"color_jitter={color_jitter!r}", "needs 3 (brightness, contrast, saturation) or 4 (and hue) values")
        return tuple(float(v) for v in color_jitter)
    return (float(color_jitter),) * 3


def _recipe_augmentation(scale, ratio, hflip, auto_augment, re_prob, re_mode, train_crop_mode):
    """timm's training arguments as the recipe fields `train_transform` reads; what a recipe cannot express
    is refused."""
    if train_crop_mode not in (None, "rrc"):
        _refuse(f"train_crop_mode={train_crop_mode!r}", "is not a recipe crop: vitkit trains with 'rrc' "
                "(RandomResizedCrop)")
    scale = tuple(scale or TIMM_DEFAULT_SCALE)
    if len(scale) != 2 or scale[1] != 1.0 or not 0 < scale[0] <= 1:
        _refuse(f"scale={scale!r}", "must be (min_area, 1.0) with 0 < min_area <= 1: the recipe's "
                "RandomResizedCrop always allows the whole image")
    if ratio is not None and tuple(ratio) != TIMM_DEFAULT_RATIO:
        _refuse(f"ratio={tuple(ratio)!r}", "is not the recipe's aspect-ratio range (3/4, 4/3)")
    if auto_augment and auto_augment not in AUTO_AUGMENTS:
        _refuse(f"auto_augment={auto_augment!r}", "is not one of the recipes' policies: 'rand' (torchvision's "
                "RandAugment, 2 ops at magnitude 9 of 30) or 'trivial' (TrivialAugmentWide); timm's policy "
                "strings (rand-m9-mstd0.5, augmix, ...) have no vitkit equivalent")
    if re_mode != "const":
        _refuse(f"re_mode={re_mode!r}", "is not the recipe's RandomErasing: it erases to 0 (timm's 'const')")
    return types.SimpleNamespace(crop="rrc", crop_scale=float(scale[0]), crop_padding=0, hflip=float(hflip),
                                 auto_augment=auto_augment or None, ra_num_ops=2, ra_magnitude=9,
                                 reprob=float(re_prob))


def create_transform(input_size=TIMM_DEFAULT_SIZE, is_training: bool = False, no_aug: bool = False,
                     train_crop_mode: str | None = None, scale=None, ratio=None, hflip: float = 0.5,
                     color_jitter=0.4, auto_augment: str | None = None, interpolation: str = "bilinear",
                     mean=None, std=None, re_prob: float = 0.0, re_mode: str = "const",
                     crop_pct: float | None = None, crop_mode: str | None = None,
                     **timm_options) -> v2.Compose:
    """timm's `create_transform`, with its argument names: `create_transform(**resolve_data_config(model=m))`.

    - eval (is_training=False): timm's eval transform exactly (`eval_transform`): resize so that the
      `crop_pct` centre crop fills `input_size` (crop_mode center | squash | border), crop, [0, 1], normalise.
      Equal to timm's tensor on PIL images (to float rounding).
    - is_training=True, no_aug=True: timm's no-augmentation training transform (resize, centre crop).
    - is_training=True: vitkit's recipe augmentation (`train_transform`): RandomResizedCrop with `scale`,
      horizontal flip `hflip`, `auto_augment` 'rand' or 'trivial', RandomErasing `re_prob`, and timm's
      ColorJitter `color_jitter` when no auto-augment is on. Random, so not timm's pixels.

    `input_size` is (C, H, W), (H, W) or one side; mean/std default to ImageNet's. timm options vitkit does
    not implement (vflip, NaFlex, prefetcher, ...) are refused with a ConfigError unless they are off.
    """
    _check_timm_options(timm_options)
    from ..models.config import IMAGENET_MEAN, IMAGENET_STD

    mean, std = tuple(mean or IMAGENET_MEAN), tuple(std or IMAGENET_STD)
    sizes = tuple(input_size) if isinstance(input_size, (tuple, list)) else (int(input_size),) * 2
    if len(sizes) not in (2, 3):
        _refuse(f"input_size={input_size!r}", "must be (C, H, W), (H, W) or one side")
    channels = sizes[0] if len(sizes) == 3 else len(mean)
    if channels not in (1, 3):
        _refuse(f"input_size={input_size!r}", f"has {channels} channels; vitkit's transforms make 1 or 3")
    height, width = sizes[-2:]
    if crop_mode is not None and crop_mode not in CROP_MODES:
        _refuse(f"crop_mode={crop_mode!r}", f"is not one of {', '.join(CROP_MODES)}")

    if is_training and no_aug:
        # timm's transforms_noaug_train: Resize(img_size) then CenterCrop: a (H, W) size is resized to
        # exactly (squash), one side scales the shorter side (center)
        one_side = not isinstance(input_size, (tuple, list))
        config = DataConfig((channels, height, width), _interpolation(
            "bilinear" if interpolation == "random" else interpolation), mean, std, 1.0,
            "center" if one_side else "squash")
        return eval_transform(config)
    if not is_training:
        config = DataConfig((channels, height, width), _interpolation(interpolation), mean, std,
                            crop_pct or TIMM_DEFAULT_CROP_PCT, crop_mode or TIMM_DEFAULT_CROP_MODE)
        return eval_transform(config)
    if interpolation == "random":
        _refuse("interpolation='random'", "(timm's per-image choice) is not in the recipe augmentation: pass "
                "'bicubic' or 'bilinear'")
    config = DataConfig((channels, height, width), _interpolation(interpolation), mean, std,
                        crop_pct or TIMM_DEFAULT_CROP_PCT)
    recipe = _recipe_augmentation(scale, ratio, hflip, auto_augment, re_prob, re_mode, train_crop_mode)
    # timm switches the jitter off when an auto-augment policy runs
    jitter = None if auto_augment else _color_jitter(color_jitter)
    return train_transform(config, recipe, color_jitter=jitter)

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
# how much the eval resize may enlarge an image before `conversion_note` says so: beyond it the model sees
# interpolation blur, not detail (a 5x5 icon into a 224 px model is enlarged ~50x)
UPSCALE_NOTE_RATIO = 4.0


def upscale_factor(image_wh: tuple[int, int], pre) -> float:
    """How many times the eval transform enlarges an image of `image_wh` (width, height): the larger of the
    two side ratios of `eval_resize_size` (below 1 when it shrinks)."""
    w, h = (int(v) for v in image_wh)
    new_h, new_w = eval_resize_size((h, w), pre)
    return max(new_h / h, new_w / w)


def _likewise(count: int) -> str:
    return f"{count} more image{'s' if count > 1 else ''} likewise" if count else ""


def conversion_note(pre, sources, trained_on: str | None = None) -> str | None:
    """One line saying what the images became when they differ from what the model was trained on, or None.

    `sources` are (name, (width, height, channels, mode) or None) pairs (`data.images.image_source`). An
    image counts when its channel count differs from the model's or it is more than LARGE_INPUT_RATIO times
    the model's input on both sides (a photo into a 28x28 model), and, in a second clause of the same line,
    when the eval resize enlarges it more than UPSCALE_NOTE_RATIO times; matching data gives no note.
    """
    c, h, w = (int(v) for v in pre.input_size)
    known = [(Path(str(name)).name, s) for name, s in sources if s is not None]
    odd = [(name, s) for name, s in known if s[2] != c or min(s[0] / w, s[1] / h) > LARGE_INPUT_RATIO]
    small = [(name, s, factor) for name, s in known
             if (factor := upscale_factor(s[:2], pre)) > UPSCALE_NOTE_RATIO]
    clauses = []
    if odd:
        name, (sw, sh, sc, _) = odd[0]
        more = f"; {_likewise(len(odd) - 1)}" if len(odd) > 1 else ""
        on = f" on {trained_on}" if trained_on else ""
        clauses.append(f"images are converted to {c}-channel {h}x{w} as the model was trained{on} "
                       f"({name} was {sw}x{sh} {'RGB' if sc == 3 else 'grayscale'}{more})")
    if small:
        name, (sw, sh, _, _), factor = small[0]
        more = f" ({_likewise(len(small) - 1)})" if len(small) > 1 else ""
        times = f"{factor:.0f}" if factor >= 10 else f"{factor:.1f}"  # 50x, but 4.1x (not 4x) near the limit
        clauses.append(f"{name} is {sw}x{sh} px, upscaled {times}x to the model's {h}x{w} input; "
                       f"predictions on images this small are unreliable{more}")
    return f"note: {'; '.join(clauses)}" if clauses else None
