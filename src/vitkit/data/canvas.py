"""A dense task from real data: items of a labelled set pasted onto a larger canvas, with per-pixel class masks.

`canvas-fashion`: Fashion-MNIST items (28 px, scaled 0.6-1.4x) pasted 1-3 at a time at random positions onto
a 64x64 canvas; `canvas-digits`: scikit-learn digits (8 px, scaled 1.5-3x) onto 32x32, for quick runs;
`canvas-digits-boxes` (detection, `BOX_SPECS`): digits onto 48x48, each item's box the bounds of its pixels
still visible (an item covered whole has none), as data/coco.py's DetectionImages. The
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
# detection sets: the same pasting, each item's box the bounds of its pixels still visible (builtin.py's DETECTION)
BOX_SPECS = {
    "canvas-digits-boxes": CanvasSpec("digits", 48, (1.5, 3.0), (1, 3), train=3000, test=400, threshold=64),
}


def spec_of(name: str) -> CanvasSpec:
    if name not in SPECS and name not in BOX_SPECS:
        raise DataError(f"unknown canvas dataset {name!r}; known: {', '.join([*SPECS, *BOX_SPECS])}")
    return SPECS.get(name) or BOX_SPECS[name]


class CanvasSegmentation(Dataset):
    """Canvases uint8 [N, 1, S, S] with masks uint8 [N, S, S] -> (image [1, S, S] uint8, mask [S, S] int64).

    `labels` (one class per canvas: the item covering most pixels) is what stratified subsets split on."""

    def __init__(self, images: torch.Tensor, masks: torch.Tensor, labels: torch.Tensor,
                 boxes: list[torch.Tensor] | None = None):
        self.images, self.masks, self.labels = images, masks, labels
        self.boxes = boxes  # per canvas [n, 5]: x0, y0, x1, y1 (pixels, exclusive end), mask class

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], self.masks[i].long()

    def subset(self, idx: Sequence[int]) -> CanvasSegmentation:
        idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        boxes = [self.boxes[i] for i in idx.tolist()] if self.boxes is not None else None
        return CanvasSegmentation(self.images[idx], self.masks[idx], self.labels[idx], boxes)


def paste_canvases(items: torch.Tensor, classes: torch.Tensor, count: int, spec: CanvasSpec,
                   seed: int) -> CanvasSegmentation:
    """`count` canvases from source images `items` uint8 [N, 1, h, w] with classes [N] (0-based)."""
    rng = np.random.default_rng(seed)
    S = spec.size
    images = torch.from_numpy(rng.integers(0, spec.noise + 1, size=(count, 1, S, S), dtype=np.uint8))
    masks = torch.zeros(count, S, S, dtype=torch.uint8)
    h = items.shape[-2]
    boxes = []
    for n in range(count):
        owner = torch.zeros(S, S, dtype=torch.long)  # which pasted item (1-based) each pixel shows
        item_classes = []
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
            owner[y:y + side, x:x + side][fg] = len(item_classes) + 1
            item_classes.append(int(classes[j]) + 1)
        boxes.append(_visible_boxes(owner, item_classes))
    counts = torch.stack([(masks == c).flatten(1).sum(1) for c in range(1, int(classes.max()) + 2)], 1)  # [N, K]
    return CanvasSegmentation(images, masks, counts.argmax(1), boxes)


def _visible_boxes(owner: torch.Tensor, item_classes: list[int]) -> torch.Tensor:
    """[n, 5] boxes (x0, y0, x1, y1, class) of the items with pixels left visible in `owner` [S, S]."""
    rows = []
    for k, c in enumerate(item_classes, start=1):
        ys, xs = torch.nonzero(owner == k, as_tuple=True)
        if len(ys):  # an item covered whole by later ones has no box
            rows.append([int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1, c])
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 5)


def load_canvas(name: str, source: DataBundle) -> DataBundle:
    """The DataBundle of a registered canvas set (`SPECS`), pasted from `source`, the bundle of the set its spec
    names (builtin.py loads it: canvas builds on bundles, not on the resolver that lists the sets)."""
    spec = spec_of(name)
    splits = []
    for k, (ds, count) in enumerate(((source.train, spec.train), (source.test, spec.test))):
        splits.append(paste_canvases(ds.images, ds.labels, count, spec, seed=spec.seed * 1000 + k))
    if name in BOX_SPECS:
        return _box_bundle(name, spec, source, splits)
    info = {"source": f"{source.name} ({source.info.get('source', '')}) items pasted onto canvases",
            "canvas": asdict(spec), "task": "segmentation: per-pixel class, 0 = background"}
    return DataBundle(name, ["background", *source.class_names], 1, (spec.size, spec.size), splits[0], None,
                      splits[1], info)


def _box_bundle(name: str, spec: CanvasSpec, source: DataBundle, splits: list[CanvasSegmentation]) -> DataBundle:
    """The canvases as a detection set: one box per visible item, labels 1 + the item's class."""
    from .coco import DetectionImages

    def boxes(ds: CanvasSegmentation) -> DetectionImages:
        return DetectionImages(ds.images, [b[:, :4] for b in ds.boxes], [b[:, 4] for b in ds.boxes],
                               sizes=[(spec.size, spec.size)] * len(ds), image_ids=range(len(ds)),
                               category_ids=range(1, len(source.class_names) + 1), channels=1)

    info = {"source": f"{source.name} ({source.info.get('source', '')}) items pasted onto canvases",
            "canvas": asdict(spec), "task": "detection: a box around the visible pixels of each pasted item"}
    return DataBundle(name, ["background", *source.class_names], 1, (spec.size, spec.size), boxes(splits[0]), None,
                      boxes(splits[1]), info)
