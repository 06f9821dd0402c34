"""What `vitkit embed` reads: an image folder, a CSV manifest, a built-in dataset or another data source of
`load_data` (WebDataset tar shards), as one ordered list of items.

Every item keeps a reference to where it came from, so a search hit always points at the original: the file's
path for folders and manifests, `NAME:SPLIT/INDEX` for the built-in sets (they have no files). The order is a
pure function of the source (sorted paths, manifest order, dataset order): a resumed run and every torchrun
rank see the same list, which the embedding plan checks by its hash.

- folder: every image file below it (recursive, hidden entries skipped); the label is the name of the folder
  holding the file when that is not the root (`root/cat/1.jpg` -> `cat`, `root/train/cat/1.jpg` -> `cat`);
- CSV manifest: `path[,label]` rows, header optional, paths relative to the CSV;
- `digits`, `fashion-mnist`: the split asked for (`all`: train, then val, then test);
- tar shards (data/shards.py): the same, each item named by its sample's WebDataset key.
"""
from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data.datasets import BUILTIN, BUILTIN_ALIASES, claiming_source, load_data
from ..data.images import image_source, is_image_file, load_image
from ..errors import DataError

SPLITS = ("all", "train", "val", "test")


@dataclass
class Source:
    """An ordered collection: `refs[i]` names item i (a path or `NAME:SPLIT/INDEX`), `labels[i]` its label."""

    spec: str
    kind: str  # folder | csv | dataset
    refs: list[str]
    labels: list[str | None]
    datasets: dict[str, Any] = field(default_factory=dict)  # built-in or shards: split -> dataset
    positions: list[tuple[str, int]] = field(default_factory=list)  # kind dataset: item i -> (split, index)

    def __len__(self) -> int:
        return len(self.refs)

    def digest(self) -> str:
        """sha256 of the item list (refs and labels): the same source gives the same digest."""
        h = hashlib.sha256()
        for ref, label in zip(self.refs, self.labels):
            h.update(f"{ref}\t{label}\n".encode())
        return h.hexdigest()

    def load(self, i: int, channels: int):
        """-> (image: PIL image or uint8 tensor [C, H, W], {bytes, width, height}); raises ImageError."""
        ref = self.refs[i]
        if self.kind == "dataset":
            split, index = self.positions[i]
            ds = self.datasets[split]
            if hasattr(ds, "channels"):  # decoded on access (shards): in the model's channels, as files are
                ds.channels = channels
            x, _ = ds[index]
            if isinstance(x, torch.Tensor):
                return x, {"width": int(x.shape[-1]), "height": int(x.shape[-2])}
            src = image_source(x)
            return x, {"width": src[0], "height": src[1]} if src is not None else {}
        img = load_image(ref, channels)
        src = image_source(img)
        info = {"bytes": os.path.getsize(ref)}
        if src is not None:
            info |= {"width": src[0], "height": src[1]}
        return img, info


def open_source(spec: str, split: str = "all", options: dict[str, Any] | None = None) -> Source:
    """Resolve `spec` (a folder, a CSV manifest, a built-in dataset name or another data source: shards, a
    datasets folder) into a Source; `options`: that source's settings (`data.label_key=...`)."""
    spec = str(spec)
    if split not in SPLITS:
        raise DataError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if spec in BUILTIN_ALIASES or claiming_source(spec) is not None:  # a data source's splits (shards, ...)
        return _dataset(spec, split, options)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"{spec}: no such folder, CSV manifest or built-in dataset (built-in: {', '.join(BUILTIN)})")
    if split != "all":
        raise DataError(f"--split applies to the built-in datasets; {spec} is read whole")
    if path.is_dir():
        src = _folder(path)
    elif path.suffix.lower() in (".csv", ".tsv", ".txt"):
        src = _csv(path)
    else:
        raise DataError(f"{spec}: expected an image folder, a CSV manifest (path[,label]) or a built-in dataset")
    if not len(src):
        raise DataError(f"{spec}: no image files found")
    return src


def _dataset(spec: str, split: str, options: dict[str, Any] | None = None) -> Source:
    bundle = load_data(spec, options=options)
    splits = {"train": bundle.train, "val": bundle.val, "test": bundle.test}
    chosen = [s for s in ("train", "val", "test") if splits[s] is not None] if split == "all" else [split]
    if splits.get(chosen[0]) is None:
        raise DataError(f"{spec} has no {split} split (it has: {', '.join(s for s, d in splits.items() if d)})")
    refs, labels, datasets, positions = [], [], {}, []
    for s in chosen:
        ds = splits[s]
        datasets[s] = ds
        # a built-in image has no name of its own: NAME:SPLIT/INDEX; a sample of shards keeps its key
        refs += ([f"{bundle.name}:{s}/{i}" for i in range(len(ds))] if spec in BUILTIN_ALIASES else ds.keys())
        labels += [bundle.class_names[int(y)] for y in ds.labels]
        positions += [(s, i) for i in range(len(ds))]
    return Source(spec, "dataset", refs, labels, datasets, positions)


def _folder(root: Path) -> Source:
    root = root.resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file() and is_image_file(p)
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    labels = [p.parent.name if p.parent != root else None for p in files]
    return Source(str(root), "folder", [str(p) for p in files], labels)


def _csv(path: Path) -> Source:
    try:
        rows = [r for r in csv.reader(path.read_text().splitlines(), delimiter="\t" if path.suffix == ".tsv" else ",")
                if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: unreadable CSV manifest ({e})") from None
    if rows and rows[0][0].strip().lower() == "path":
        rows = rows[1:]
    base = path.resolve().parent
    refs = [str((base / r[0].strip()).resolve()) for r in rows]
    labels = [(r[1].strip() or None) if len(r) > 1 else None for r in rows]
    return Source(str(path.resolve()), "csv", refs, labels)
