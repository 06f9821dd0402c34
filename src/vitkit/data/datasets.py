"""Datasets a user can point vitkit at, all resolved into one `DataBundle` of train / val / test splits.

`--data` accepts:
- `digits`: scikit-learn's 1,797 8x8 digits (0..16 scaled to 0..255); seeded stratified 80/20 train/test;
- `fashion-mnist`: the official 60,000 / 10,000 split (see fashion_mnist.py for where files come from);
- a folder: one sub-folder per class, or `train/` + `val/` (+ `test/`) folders each holding class folders;
  without a val folder a seeded, stratified fraction of train becomes the validation split (the training
  run asks for `default_val_fraction(spec)`, 15%, when its recipe sets no `val_fraction`; every class keeps
  at least one image on each side, so each class needs two or more);
- a CSV manifest `path,label` (header optional, paths relative to the CSV), split like a flat folder;
- `canvas-fashion`, `canvas-digits`: segmentation canvases with per-pixel masks made from those (canvas.py).
- `canvas-digits-boxes` or a COCO annotation file `ANN.json`: detection (boxes; coco.py).

Small built-in sets live in memory as uint8 tensors [N, C, H, W]; user files are decoded on access.
Files that cannot be decoded are skipped and counted (listed in `info['skipped']`), or stop the run with
`strict=True`. Every split is a pure function of the seed, and the indices are recorded in `info`.
"""
from __future__ import annotations

import csv
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from ..errors import ConfigError, DataError, ImageError
from .builtin import BUILTIN_SETS, builtin_set
from .bundle import DataBundle, FileImages, TensorImages, stratified_split  # noqa: F401  (re-exported: vitkit reads them here)
from .coco import load_coco
from .splits import EVAL_SPLITS  # what an evaluation may score

log = logging.getLogger("vitkit")

BUILTIN = tuple(BUILTIN_SETS)  # the canonical names (builtin.py's table)
BUILTIN_ALIASES = tuple(a for name, entry in BUILTIN_SETS.items() for a in (name, *entry.aliases))
DEFAULT_VAL_FRACTION = 0.15  # user folders and manifests without a val split (see default_val_fraction)
VAL_DIRS = ("val", "valid", "validation")
LABEL_PREFIXES = ("folder:", "csv:")  # a user dataset's DataBundle.name: the prefix, then its absolute path


class Transformed(Dataset):
    """Applies `transform` with randomness that is a pure function of (seed, epoch, index).

    That makes augmentation identical across worker counts, DDP ranks and a resumed run.

    `batched` (data.transforms.BatchedTransform, optional): the same pipeline on a whole batch (uint8 images
    [B, C, H, W], each sample's seed) where the base holds its images in memory (`batch`); it then serves every
    sample, one at a time too, so that a sample's augmentation is the same in any batch and any loader.
    """

    def __init__(self, base: Dataset, transform: Callable, seed: int = 0, deterministic: bool = True,
                 batched: Callable | None = None):
        self.base, self.transform, self.seed, self.deterministic = base, transform, seed, deterministic
        self.batched = batched if hasattr(base, "batch") else None
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitems__(self, indices: list) -> list:
        """What DataLoader fetches a batch with: the batched pipeline in one call where there is one."""
        if self.batched is None or any(isinstance(i, tuple) for i in indices):
            return [self[i] for i in indices]
        images, labels = self.base.batch(indices)
        x = self.batched(images, [sample_seed(self.seed, self.epoch, int(i)) for i in indices])
        return list(zip(x.unbind(0), labels.tolist()))

    def __getitem__(self, i):
        """i: an index, or (index, argument) where the batch sampler gives the transform one (a NaFlex step's
        sequence length, training/token_budget.py)."""
        if self.batched is not None and not isinstance(i, tuple):
            return self.__getitems__([i])[0]
        i, *arg = i if isinstance(i, tuple) else (i,)
        x, y = self.base[i]
        if not self.deterministic:
            return self.transform(x, *arg), y
        # only the CPU generator (torch.manual_seed also seeds every accelerator: 50x slower)
        gen = torch.default_generator
        saved = gen.get_state()
        gen.manual_seed(sample_seed(self.seed, self.epoch, i))
        try:
            return self.transform(x, *arg), y
        finally:
            gen.set_state(saved)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + index * 104_729 + 12345) % (2**63 - 1)


def load_data(spec: str, *, seed: int = 0, val_fraction: float = 0.0, strict: bool = False,
              channels: int = 3, allow_download: bool = True, subset: int | None = None,
              eval_subset: int | None = None, options: dict[str, Any] | None = None) -> DataBundle:
    """Resolve `spec` (a built-in name, a folder or a CSV file) into train/val/test splits. `options`: the data
    source's own settings (`--set data.label_key=...`), checked against what the source's `load` accepts."""
    spec = str(spec)
    source = claiming_source(spec)
    options = source_options(source, spec, options or {})
    if (found := builtin_set(spec)) is not None:
        bundle = found[1].loader(seed, allow_download)
    elif source is not None:
        bundle = source.load(spec, seed=seed, strict=strict, channels=channels, allow_download=allow_download,
                             **options)
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            raise DataError(f"{spec}: no such dataset, folder or CSV file (built-in: {', '.join(BUILTIN)})")
        if path.is_dir():
            bundle = _folder(path, strict, channels)
        elif path.suffix.lower() in (".csv", ".tsv", ".txt"):
            bundle = _csv(path, strict, channels)
        elif path.suffix.lower() == ".json":  # a COCO annotation file: detection (coco.py splits it)
            bundle = load_coco(path, strict=strict, channels=channels, seed=seed, val_fraction=val_fraction)
        else:
            raise DataError(f"{spec}: expected a folder of class folders, a CSV manifest (path,label) or a COCO annotation file (.json)")
    if val_fraction and bundle.val is None:
        carve_val(bundle, val_fraction, seed, spec)
    # quick experiments: seeded stratified subsets of train (`subset`) and of the evaluated splits (`eval_subset`)
    for split, count in (("train", subset), ("val", eval_subset), ("test", eval_subset)):
        part = getattr(bundle, split)
        if count and part is not None and count < len(part):
            keep, _ = stratified_split(part.labels.tolist(), 1 - count / len(part), seed)
            setattr(bundle, split, part.subset(keep))
            bundle.info[f"{split}_subset"] = len(keep)
    if len(bundle.train) == 0:
        raise DataError(f"{spec}: no training images")
    return bundle


# Data sources that live in their own files (a new format is a new file, not a branch here). Each module has
# `claims(spec) -> bool` (cheap: a pattern, a suffix, a marker file) and
# `load(spec, *, seed, strict, channels, allow_download) -> DataBundle`, whose bundle is named by the spec it was
# loaded from (absolute paths), so a run's provenance reads back through `data_spec`. Asked in this order, after
# the built-in names and before the folder / CSV / COCO rules below.
SOURCE_MODULES = ("vitkit.data.shards", "vitkit.data.hf_datasets")


def claiming_source(spec: str):
    """The source module that reads `spec`, or None when the folder / CSV / COCO rules do."""
    import importlib

    for name in SOURCE_MODULES:
        module = importlib.import_module(name)
        if module.claims(spec):
            return module
    return None


def source_options(source, spec: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` when `source` (a module of SOURCE_MODULES, or None) takes every one of them; else one line."""
    if not options:
        return {}
    import inspect

    standard = {"spec", "seed", "strict", "channels", "allow_download"}
    known = [] if source is None else [n for n in inspect.signature(source.load).parameters if n not in standard]
    unknown = [k for k in options if k not in known]
    if unknown:
        what = (f"its options are {', '.join('data.' + k for k in known)}" if known
                else "only tar shards and Hugging Face datasets take data.* options")
        raise ConfigError(f"--set data.{unknown[0]}: {spec} does not take this option ({what})")
    return options


def default_val_fraction(spec: str) -> float:
    """The validation fraction a training run carves when its recipe sets none: 0 for the built-in sets (they
    have an official or seeded test split), DEFAULT_VAL_FRACTION for a user folder or manifest (used only when
    it has no val/ folder), so the best checkpoint is chosen on held-out images rather than on training ones."""
    return 0.0 if str(spec) in BUILTIN_ALIASES else DEFAULT_VAL_FRACTION


def carve_val(bundle: DataBundle, fraction: float, seed: int, where: str = "") -> None:
    """Move a seeded, stratified `fraction` of train into val (at least one image per class, and at least one
    left to train on); the indices into the original train list are recorded in `info`."""
    labels = bundle.train.labels.tolist()
    counts = np.bincount(labels, minlength=bundle.num_classes)
    few = [bundle.class_names[i] for i in np.flatnonzero(counts < 2)]
    if few:
        n = int(counts[bundle.class_names.index(few[0])])
        raise DataError(f"{where or bundle.name}: class {few[0]!r}" + (f" (and {len(few) - 1} more)" if len(few) > 1
                        else "") + f" has {n} image(s); a validation split needs at least 2 per class (1 to train "
                        "on, 1 to validate): add images, or give train/ and val/ folders")
    keep, held = stratified_split(labels, fraction, seed, min_held=1)
    bundle.val, bundle.train = bundle.train.subset(held), bundle.train.subset(keep)
    bundle.info["split_indices"] = (bundle.info.get("split_indices") or {}) | {"val_from_train": held}
    bundle.info["val_split"] = {"fraction": fraction, "seed": seed}


# ---------------------------------------------------------------------------- user files
def _scan_classes(root: Path, class_names: list[str] | None = None) -> tuple[list[str], list[Path], list[int], list[str]]:
    """class folders under `root` -> (class names, paths, labels, empty class names)."""
    from .images import is_image_file

    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = class_names or [p.name for p in dirs]
    paths, labels, empty = [], [], []
    for d in dirs:
        if d.name not in names:
            raise DataError(f"{d}: class folder {d.name!r} is not in the training classes {names}")
        files = sorted(p for p in d.rglob("*") if p.is_file() and is_image_file(p))
        if not files:
            empty.append(d.name)
        paths += files
        labels += [names.index(d.name)] * len(files)
    return names, paths, labels, empty


def _verify(paths: list[Path], labels: list[int], strict: bool, channels: int, where: str):
    """Decode every file once: bad ones are skipped and counted (or stop the run with strict)."""
    from .images import load_image

    good_p, good_l, skipped, sizes = [], [], [], set()
    for p, y in zip(paths, labels):
        try:
            img = load_image(p, channels)
            sizes.add(img.size)
            good_p.append(p)
            good_l.append(y)
        except ImageError as e:
            if strict:
                raise DataError(f"{e} (--strict stops at the first unreadable image)") from None
            skipped.append({"path": str(p), "reason": str(e)})
    if skipped:
        log.warning("%s: skipped %d unreadable image(s), e.g. %s", where, len(skipped), skipped[0]["reason"])
    size = next(iter(sizes))[::-1] if len(sizes) == 1 else None  # PIL (W, H) -> (H, W)
    return good_p, good_l, skipped, size


def _folder(root: Path, strict: bool, channels: int) -> DataBundle:
    sub = {p.name.lower(): p for p in root.iterdir() if p.is_dir()}
    train_dir = sub.get("train")
    val_dir = next((sub[n] for n in VAL_DIRS if n in sub), None)
    test_dir = sub.get("test")
    info: dict[str, Any] = {"source": str(root)}
    splits: dict[str, FileImages | None] = {"train": None, "val": None, "test": None}
    names, skipped_all, sizes, empties = None, [], set(), {}
    for split, d in (("train", train_dir or root), ("val", val_dir), ("test", test_dir)):
        if d is None:
            continue
        names_here, paths, labels, empty = _scan_classes(d, names)
        names = names or names_here
        if empty:
            empties[split] = empty
        paths, labels, skipped, size = _verify(paths, labels, strict, channels, str(d))
        skipped_all += skipped
        sizes.add(size)
        splits[split] = FileImages(paths, labels, channels)
    if not names:
        raise DataError(f"{root}: no class folders (expected {root}/<class>/<image> or {root}/train/<class>/...)")
    if empties.get("train"):
        # a class with no training image cannot be learned: a clear stop rather than a silent dead output
        raise DataError(f"{root}: class folder(s) {empties['train']} hold no readable images; add images or "
                        "remove the folder(s)")
    counts = np.bincount(splits["train"].labels.numpy(), minlength=len(names))
    if (counts == 0).any():
        bad = [names[i] for i in np.flatnonzero(counts == 0)]
        raise DataError(f"{root}: class folder(s) {bad} hold no readable images after skipping broken files")
    info.update(skipped=skipped_all, num_skipped=len(skipped_all), empty_eval_classes=empties or None)
    size = next(iter(sizes)) if len(sizes) == 1 else None
    return DataBundle(f"folder:{_absolute(root)}", names, channels, size, splits["train"], splits["val"], splits["test"], info)


def _csv(path: Path, strict: bool, channels: int) -> DataBundle:
    try:
        rows = [r for r in csv.reader(path.read_text().splitlines()) if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: unreadable CSV manifest ({e})") from None
    if rows and [c.strip().lower() for c in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]
    if not rows:
        raise DataError(f"{path}: the manifest lists no images")
    bad = [i + 1 for i, r in enumerate(rows) if len(r) < 2]
    if bad:
        raise DataError(f"{path}: row(s) {bad[:5]} need two columns: path,label")
    names = sorted({r[1].strip() for r in rows})
    paths = [(path.parent / r[0].strip()) for r in rows]
    labels = [names.index(r[1].strip()) for r in rows]
    paths, labels, skipped, size = _verify(paths, labels, strict, channels, str(path))
    if not paths:
        raise DataError(f"{path}: none of the listed images could be read")
    return DataBundle(f"csv:{_absolute(path)}", names, channels, size, FileImages(paths, labels, channels), None, None,
                      {"source": str(path), "skipped": skipped, "num_skipped": len(skipped)})


def _absolute(path: str | Path) -> str:
    """The absolute, normalised form of a user path (a run records it, so eval finds the data from anywhere)."""
    return os.path.abspath(os.path.expanduser(str(path)))


def data_spec(label: str | None) -> str | None:
    """A dataset's label (DataBundle.name, as a checkpoint's provenance records it) -> the spec load_data reads."""
    for prefix in LABEL_PREFIXES:
        if isinstance(label, str) and label.startswith(prefix):
            return label[len(prefix):]
    return label


def same_data(a: str | None, b: str | None) -> bool:
    """Whether two --data specs (or labels) name the same data: one built-in set under any alias, or one folder
    or manifest however its path is written (relative, absolute, with a trailing slash)."""
    if a is None or b is None:
        return False

    def canonical(spec: str) -> str:
        spec = data_spec(str(spec))
        found = builtin_set(spec)
        return found[0] if found else _absolute(spec)

    return canonical(a) == canonical(b)


def eval_split(bundle: DataBundle, split: str | None = None) -> tuple[str, Dataset]:
    """The images an evaluation scores -> (split name, dataset). `split`: test | val | train | all (every split
    together); by default the held-out one: test, else val, else, for data that was never split (a folder or
    CSV other than a run's training data, with no val/ or test/ folder), all of it. The one place that chooses:
    `vitkit eval`, the frozen-feature probes and export's int8 report all call it (through `load_eval_split`)."""
    parts = {"test": bundle.test, "val": bundle.val, "train": bundle.train}
    if split is None:
        split = next((s for s in ("test", "val") if parts[s] is not None), "all")
    if split == "all":
        present = [d for d in parts.values() if d is not None]
        return split, present[0] if len(present) == 1 else ConcatDataset(present)
    if split not in parts:
        raise ConfigError(f"unknown split {split!r}; choose from {', '.join(EVAL_SPLITS)}")
    if parts[split] is None:
        raise DataError(f"{bundle.name} has no {split} split")
    return split, parts[split]


def load_eval_split(data: str, *, channels: int, class_names: list[str] | None = None, split: str | None = None,
                    seed: int = 0, val_fraction: float = 0.0,
                    strict: bool = False, options: dict[str, Any] | None = None) -> tuple[DataBundle, str, Dataset]:
    """What an evaluation scores -> (the whole data, the split's name, the split): `load_data` with the seed and
    validation fraction a training run used, the labels re-indexed onto `class_names` (a model's classes) when
    given, then `eval_split`. The one loader of `vitkit eval`, the frozen-feature probes and export's int8 report."""
    bundle = load_data(data, seed=seed, val_fraction=val_fraction, strict=strict, channels=channels, options=options)
    if class_names:
        map_labels(bundle, class_names)
    name, ds = eval_split(bundle, split)
    return bundle, name, ds


def eval_loader(ds: Dataset, preprocess, *, batch_size: int = 256, limit: int | None = None) -> DataLoader:
    """A split's (images [B, C, H, W], labels [B]) batches as a model with `preprocess` sees them at evaluation:
    its eval transform, no randomness, in order; the first `limit` images at most."""
    from .transforms import batched_eval_transform, collate, eval_transform

    if limit is not None and limit < len(ds):
        ds = ds.subset(range(limit)) if isinstance(ds, TensorImages) else Subset(ds, range(limit))
    # in-memory images at the input size take the batched form (the same tensors, no per-image Python)
    size = tuple(ds.images.shape[-2:]) if isinstance(ds, TensorImages) else None
    return DataLoader(Transformed(ds, eval_transform(preprocess), deterministic=False,
                                  batched=batched_eval_transform(preprocess, size)),
                      batch_size=batch_size, collate_fn=collate)


def describe_split(bundle: DataBundle, split: str) -> str:
    """Where a split's images come from, in words: a carved fraction and its seed, or the data's own split."""
    if split == "val" and bundle.info.get("val_split"):
        carved = bundle.info["val_split"]
        return f"carved from train: {carved['fraction']:.0%} of each class, seed {carved['seed']}"
    if split == "test" and bundle.info.get("test_split"):
        held = bundle.info["test_split"]
        return f"{held['fraction']:.0%} of each class held out, seed {held['seed']}"
    return "every image" if split == "all" else f"the data's own {split} split"


def image_keys(ds: Dataset) -> list:
    """What identifies each image of a split across two loads of the same data (its file, or its position in the
    built-in set): `shared_images` compares an evaluated split with a run's training split by these."""
    if isinstance(ds, ConcatDataset):  # eval_split's `all`
        return [k for part in ds.datasets for k in image_keys(part)]
    return ds.keys()


def shared_images(a: Dataset, b: Dataset) -> int:
    """How many images of `a` are also in `b`."""
    in_b = set(image_keys(b))
    return sum(k in in_b for k in image_keys(a))


def map_labels(bundle: DataBundle, class_names: list[str]) -> None:
    """Re-index `bundle`'s labels onto a model's class list (eval of a checkpoint on user data)."""
    if bundle.class_names == class_names:
        return
    unknown = [c for c in bundle.class_names if c not in class_names]
    if unknown:
        raise DataError(f"label(s) {unknown[:5]} are not among the model's classes {class_names[:20]}")
    lut = torch.tensor([class_names.index(c) for c in bundle.class_names])
    for ds in (bundle.train, bundle.val, bundle.test):
        if ds is not None:
            ds.labels = lut[ds.labels]
    bundle.class_names = list(class_names)
