"""The containers every data source fills: in-memory and on-disk image sets and the `DataBundle` of their
train / val / test splits, with the seeded stratified split they are cut by.

They live apart from datasets.py (which resolves a `--data` spec) so that a source built on another one
(canvas.py pastes digits and Fashion-MNIST items) needs only these, not the resolver that lists it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


class TensorImages(Dataset):
    """In-memory uint8 images [N, C, H, W] with int64 labels [N]; `ids` [N] says which image of the source each
    one is (its position in the built-in set), so splits of two loads can be compared (`keys`)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor | None = None):
        self.images, self.labels = images, labels
        self.ids = torch.arange(len(labels)) if ids is None else ids

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])

    def batch(self, idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images [B, C, H, W] and labels [B] of the samples `idx`, in one indexing (batched transforms)."""
        idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return self.images[idx], self.labels[idx]

    def subset(self, idx: Sequence[int]) -> TensorImages:
        idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return TensorImages(self.images[idx], self.labels[idx], self.ids[idx])

    def keys(self) -> list[int]:
        return self.ids.tolist()


class FileImages(Dataset):
    """Image files decoded on access by `load_image` (mode L or RGB as `channels` asks)."""

    def __init__(self, paths: list[Path], labels: list[int], channels: int = 3):
        self.paths, self.labels, self.channels = list(paths), torch.as_tensor(labels, dtype=torch.long), channels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        from .images import load_image

        return load_image(self.paths[i], self.channels), int(self.labels[i])

    def subset(self, idx: Sequence[int]) -> FileImages:
        return FileImages([self.paths[i] for i in idx], [int(self.labels[i]) for i in idx], self.channels)

    def keys(self) -> list[str]:
        return [str(p) for p in self.paths]


@dataclass
class DataBundle:
    name: str
    class_names: list[str]
    channels: int  # native channels of the images (1 gray, 3 colour)
    image_size: tuple[int, int] | None  # native size when all images share it
    train: Dataset
    val: Dataset | None
    test: Dataset | None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def set_channels(self, channels: int) -> None:
        """Datasets decoded on access (files, shards: those with `channels`) decode straight into the model's
        channel count."""
        for ds in (self.train, self.val, self.test):
            if hasattr(ds, "channels"):
                ds.channels = channels

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "classes": self.num_classes, "channels": self.channels,
                "train": len(self.train), "val": len(self.val) if self.val is not None else 0,
                "test": len(self.test) if self.test is not None else 0} | {
                    k: v for k, v in self.info.items() if k not in ("split_indices",)}


def stratified_split(labels: Sequence[int], fraction: float, seed: int,
                     min_held: int = 0) -> tuple[list[int], list[int]]:
    """Seeded per-class split -> (keep, held_out) index lists, each sorted. Every class keeps >= 1 sample
    and holds out at least `min_held` (when it has more than that)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    keep, held = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        n_held = max(round(len(idx) * fraction), min_held)
        n_held = min(n_held, len(idx) - 1)
        held.extend(idx[:n_held].tolist())
        keep.extend(idx[n_held:].tolist())
    return sorted(keep), sorted(held)
