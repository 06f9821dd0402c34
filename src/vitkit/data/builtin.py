"""The built-in data sets, in one table: each set's loader, its task and the other names it answers to.

datasets.py (`load_data`, `BUILTIN`, `same_data`), the CLI (`vitkit eval` refuses a segmentation set) and
retrieval read the names and tasks from `BUILTIN_SETS`, so a new set is one row here and nobody matches
names by their spelling (as `startswith("canvas-")` did, which also refused a user folder called canvas-x).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..errors import DataError
from . import canvas
from .bundle import DataBundle, TensorImages, stratified_split

CLASSIFICATION = "classification"  # one label per image
SEGMENTATION = "segmentation"  # one label per pixel (a mask)
DETECTION = "detection"  # boxes with a class each


@dataclass(frozen=True)
class BuiltinSet:
    loader: Callable[[int, bool], DataBundle]  # (seed, allow_download) -> the set's splits
    task: str  # CLASSIFICATION | SEGMENTATION | DETECTION
    aliases: tuple[str, ...] = ()  # other spellings `--data` accepts


def _digits(seed: int, allow_download: bool = True) -> DataBundle:
    """scikit-learn's 8x8 digits (0..16 scaled to 0..255), a seeded stratified 80/20 train/test split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("the `digits` dataset needs scikit-learn: pip install 'vitkit[data]' (or scikit-learn)") from None
    d = load_digits()
    images = torch.from_numpy(np.round(d.images * (255.0 / 16.0)).astype(np.uint8))[:, None]  # [N, 1, 8, 8]
    labels = torch.from_numpy(d.target.astype(np.int64))
    full = TensorImages(images, labels)
    train_idx, test_idx = stratified_split(d.target, 0.2, seed)
    info = {"source": "sklearn.datasets.load_digits", "test_split": {"fraction": 0.2, "seed": seed},
            "split_indices": {"test": test_idx}}
    return DataBundle("digits", [str(i) for i in range(10)], 1, (8, 8), full.subset(train_idx), None,
                      full.subset(test_idx), info)


def _fashion_mnist(seed: int, allow_download: bool = True) -> DataBundle:
    """The official 60,000 / 10,000 split (the seed does not change it)."""
    from . import fashion_mnist

    d = fashion_mnist.load(allow_download)
    train = TensorImages(*d["train"])
    n_train, n_test = len(train), len(d["test"][1])
    test = TensorImages(*d["test"], ids=torch.arange(n_train, n_train + n_test))  # ids: the train files, then test
    return DataBundle("fashion-mnist", list(fashion_mnist.CLASS_NAMES), 1, (28, 28), train, None, test,
                      {"source": str(d["dir"]), "split": "official 60000/10000"})


def _canvas(name: str, seed: int, allow_download: bool = True) -> DataBundle:
    """A canvas set pasted from its source set's splits; the canvases follow the spec's own generation seed,
    never the training seed, so every run sees the same data."""
    spec = canvas.spec_of(name)
    source = BUILTIN_SETS[spec.source].loader(spec.seed, allow_download)
    return canvas.load_canvas(name, source)


BUILTIN_SETS: dict[str, BuiltinSet] = {
    "digits": BuiltinSet(_digits, CLASSIFICATION),
    "fashion-mnist": BuiltinSet(_fashion_mnist, CLASSIFICATION, aliases=("fashion_mnist", "fmnist")),
    **{name: BuiltinSet(partial(_canvas, name), SEGMENTATION) for name in canvas.SPECS},
    **{name: BuiltinSet(partial(_canvas, name), DETECTION) for name in canvas.BOX_SPECS},
}


def builtin_set(spec: str) -> tuple[str, BuiltinSet] | None:
    """A `--data` spec -> (the set's canonical name, its entry), or None when it names no built-in set."""
    spec = str(spec)
    for name, entry in BUILTIN_SETS.items():
        if spec == name or spec in entry.aliases:
            return name, entry
    return None


def dataset_task(spec: str) -> str:
    """The task a `--data` spec's labels serve: the table's for a built-in set; a COCO annotation file (.json)
    holds boxes; a user folder or manifest one class per image."""
    found = builtin_set(spec)
    if found:
        return found[1].task
    return DETECTION if str(spec).lower().endswith(".json") else CLASSIFICATION
