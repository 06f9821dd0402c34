"""Images in, model-ready tensors out: one image for `explain`, a sample of a dataset for `analyze`."""
from __future__ import annotations

import glob
import random
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError

# built-in datasets come from vitkit.data (test split unless 'NAME:train' is asked for)
BUILTIN = ("digits", "fashion-mnist", "fashion_mnist", "fmnist")


def load_image(path, channels: int):
    """A decoded 'L' or 'RGB' PIL image, or ImageError naming the file."""
    from ..data.images import load_image as _load

    return _load(path, channels)


def prepare(model, image, size: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PIL image -> (normalised input [1, C, H, W], display pixels [C, H, W] in [0, 1]).

    The same geometry as predict and eval (timm's eval transform, `vitkit.data.transforms.eval_transform`):
    the shorter side is resized by the model's crop_pct rule, keeping the aspect ratio, then centre-cropped
    to `size` or the model's input size, so the heat map lies over exactly the pixels the model saw and a
    non-square photo is never squashed; a 1-channel model gets the grayscale image.
    """
    import dataclasses

    from torchvision.transforms.v2 import functional as TF

    from ..data.transforms import EvalResizeCrop, MatchChannels, TokenBudgetResize, native_aspect

    pre = model.preprocess
    channels = int(model.cfg.in_chans)
    size = tuple(size) if size else tuple(pre.input_size[1:])
    if native_aspect(pre) and size == tuple(pre.input_size[1:]):
        # NaFlex: the whole image at its own aspect ratio within the token budget; one image needs no padding, so
        # it is the plain input at that grid (the same outputs as its PatchBatch) and the map keeps its grid
        crop = TokenBudgetResize(pre.token_patch, pre.max_tokens, pre.interpolation)
    else:
        crop = EvalResizeCrop(dataclasses.replace(pre, input_size=(channels, *size)))
    t = TF.pil_to_tensor(crop(MatchChannels(channels)(image)))  # [C, H, W] uint8
    raw = TF.to_dtype(t, torch.float32, scale=True)  # [C, H, W] in [0, 1]
    x = TF.normalize(raw, list(pre.mean), list(pre.std))
    return x[None], raw


def _builtin_arrays(spec: str) -> tuple[np.ndarray, str]:
    """[N, H, W] uint8 images of a built-in dataset's split ('name' = test split, 'name:train')."""
    from ..data.datasets import load_data

    name, _, split = spec.partition(":")
    bundle = load_data(name, seed=0)
    split = split or ("test" if bundle.test is not None else "train")
    if split not in ("train", "test"):
        raise DataError(f"--data {spec!r}: the split must be ':train' or ':test'")
    ds = bundle.train if split == "train" else bundle.test
    return ds.images[:, 0].numpy(), f"{bundle.name} {split} split"


def sample_images(spec: str, n: int, channels: int, seed: int = 0) -> tuple[list, str]:
    """Up to `n` images (PIL, 'L' or 'RGB') from a built-in dataset name, a folder (searched
    recursively), a glob pattern or one image file, drawn at random with a fixed seed.
    Returns the images and a short description of the sample for figure titles."""
    from PIL import Image

    from ..data.images import is_image_file

    rng = random.Random(seed)
    mode = "L" if channels == 1 else "RGB"
    if spec.partition(":")[0] in BUILTIN:
        arrays, split = _builtin_arrays(spec)
        idx = sorted(rng.sample(range(len(arrays)), min(n, len(arrays))))
        images = [Image.fromarray(arrays[i], mode="L").convert(mode) for i in idx]
        return images, f"{split} ({len(images)} of {len(arrays)} images, seed {seed})"
    p = Path(spec)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and is_image_file(f))
    elif any(ch in spec for ch in "*?["):
        files = sorted(Path(f) for f in glob.glob(spec, recursive=True) if is_image_file(f))
    elif p.is_file():
        files = [p]
    else:
        raise DataError(f"--data {spec!r}: not a folder, glob pattern, image file or built-in dataset "
                        f"(digits, fashion-mnist; ':train' for the training split)")
    if not files:
        raise DataError(f"--data {spec!r}: no image files found")
    total = len(files)
    if total > n:
        files = sorted(rng.sample(files, n))
    images = [load_image(f, channels) for f in files]
    return images, f"{spec} ({len(images)} of {total} images)"
