"""A dense task from real data: items of a labelled set pasted onto a larger canvas, with per-pixel class masks.

`canvas-fashion`: Fashion-MNIST items (28 px, scaled 0.6-1.4x) pasted 1-3 at a time at random positions onto
a 64x64 canvas; `canvas-digits`: scikit-learn digits (8 px, scaled 1.5-3x) onto 32x32, for quick runs. The
mask is 0 for background and 1 + the item's class where the pasted item's pixel is bright (an item drawn
later covers earlier ones, in the image and in the mask). The background carries faint uniform noise, so
"any non-black pixel" is not already the answer.

Train canvases are made from the source's train split and test canvases from its test split, so no item
image is seen in both. Every canvas is a pure function of (generation seed, split, index): the same data
for every training seed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..errors import DataError
from .bundle import DataBundle


@dataclass(frozen=True)
class CanvasSpec:
    source: str  # the built-in set its items come from (a name in builtin.BUILTIN_SETS)
    size: int  # canvas side in pixels
    scale: tuple[float, float]  # item side = source side * U(scale)
    items: tuple[int, int]  # items per canvas, inclusive
    train: int  # canvases made from the source's train split
    test: int
    threshold: int  # an item pixel brighter than this (0..255) labels its class
    noise: int = 24  # background noise amplitude (0..255)
    seed: int = 0  # generation seed (not the training seed)


SPECS = {
    "canvas-fashion": CanvasSpec("fashion-mnist", 64, (0.6, 1.4), (1, 3), train=12000, test=2000, threshold=40),
    "canvas-digits": CanvasSpec("digits", 32, (1.5, 3.0), (1, 3), train=3000, test=600, threshold=64),
}


class CanvasSegmentation(Dataset):
    """Canvases uint8 [N, 1, S, S] with masks uint8 [N, S, S] -> (image [1, S, S] uint8, mask [S, S] int64).

    `labels` (one class per canvas: the item covering most pixels) is what stratified subsets split on."""

    def __init__(self, images: torch.Tensor, masks: torch.Tensor, labels: torch.Tensor):
        self.images, self.masks, self.labels = images, masks, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], self.masks[i].long()

    def subset(self, idx: Sequence[int]) -> CanvasSegmentation:
        idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return CanvasSegmentation(self.images[idx], self.masks[idx], self.labels[idx])


def paste_canvases(items: torch.Tensor, classes: torch.Tensor, count: int, spec: CanvasSpec,
                   seed: int) -> CanvasSegmentation:
    """`count` canvases from source images `items` uint8 [N, 1, h, w] with classes [N] (0-based)."""
    rng = np.random.default_rng(seed)
    S = spec.size
    images = torch.from_numpy(rng.integers(0, spec.noise + 1, size=(count, 1, S, S), dtype=np.uint8))
    masks = torch.zeros(count, S, S, dtype=torch.uint8)
    h = items.shape[-2]
    for n in range(count):
        for _ in range(int(rng.integers(spec.items[0], spec.items[1] + 1))):
            j = int(rng.integers(len(items)))
            side = max(2, min(S, round(h * rng.uniform(*spec.scale))))
            item = F.interpolate(items[j:j + 1].float(), size=(side, side), mode="bilinear", antialias=True,
                                 align_corners=False)[0, 0].round().clamp(0, 255).to(torch.uint8)  # [side, side]
            y, x = int(rng.integers(S - side + 1)), int(rng.integers(S - side + 1))
            fg = item > spec.threshold
            region, region_mask = images[n, 0, y:y + side, x:x + side], masks[n, y:y + side, x:x + side]
            region[fg] = item[fg]
            region_mask[fg] = int(classes[j]) + 1
    counts = torch.stack([(masks == c).flatten(1).sum(1) for c in range(1, int(classes.max()) + 2)], 1)  # [N, K]
    return CanvasSegmentation(images, masks, counts.argmax(1))


def load_canvas(name: str, source: DataBundle) -> DataBundle:
    """The DataBundle of a registered canvas set (`SPECS`), pasted from `source`, the bundle of the set its spec
    names (builtin.py loads it: canvas builds on bundles, not on the resolver that lists the sets)."""
    if name not in SPECS:
        raise DataError(f"unknown canvas dataset {name!r}; known: {', '.join(SPECS)}")
    spec = SPECS[name]
    splits = []
    for k, (ds, count) in enumerate(((source.train, spec.train), (source.test, spec.test))):
        splits.append(paste_canvases(ds.images, ds.labels, count, spec, seed=spec.seed * 1000 + k))
    info = {"source": f"{source.name} ({source.info.get('source', '')}) items pasted onto canvases",
            "canvas": asdict(spec), "task": "segmentation: per-pixel class, 0 = background"}
    return DataBundle(name, ["background", *source.class_names], 1, (spec.size, spec.size), splits[0], None,
                      splits[1], info)
