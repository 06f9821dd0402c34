"""Hugging Face `datasets` as a `--data` source: a `save_to_disk` folder, local Parquet / Arrow files, or a hub
dataset `hf:NAME` (`hf:NAME:CONFIG`).

- A `save_to_disk` folder is recognised by its marker files (`dataset_dict.json` for a DatasetDict, `state.json`
  + `dataset_info.json` for one Dataset) and memory-mapped by `datasets.load_from_disk`: nothing is copied.
- A `.parquet` / `.arrow` file, or a folder of them (at its top or in `data/`, `train/`, ... the hub's layouts),
  goes through `datasets.load_dataset`, which finds the splits from the file names (`train-*.parquet`,
  `test/...`) and converts the files once into its cache (HF_DATASETS_CACHE), as it always does.
- `hf:NAME` is `datasets.load_dataset(NAME, CONFIG)`. One short request first tells an unreachable hub from a
  missing dataset: unreachable (no network, HF_HUB_OFFLINE=1, `allow_download=False`, VITKIT_OFFLINE), the
  dataset is read from the cache only, and fails at once with one line when it is not there (datasets' own
  loader would retry an unreachable hub for about half a minute first).

The image column is the dataset's `datasets.Image` feature (or `image_key`); the label column its `ClassLabel`
feature, else an integer column named label/labels/target/class (or `label_key`, integers or names). Class
names are the ClassLabel names, else the sorted distinct values. The dataset's own splits map onto the
bundle's: train, validation|val|valid -> val, test; a lone Dataset is all train. Rows are decoded on access
(never the whole set in memory) by vitkit's own decoder, so a row's pixels equal those of the same image as a
file; every image is decoded once at load, as folders are, and an undecodable one is skipped and counted in
info['skipped'] (or stops the run with `strict`). Rows whose label is missing (None, or ClassLabel's -1 of
unlabelled test splits) are left out and counted in info['unlabeled'].
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError, ImageError, OfflineError
from .bundle import DataBundle
from .datasets import VAL_DIRS, _absolute
from .images import _one_line, decode_image, load_image

log = logging.getLogger("vitkit")

HUB_PREFIX = "hf:"
DATASET_DICT_MARKER = "dataset_dict.json"  # save_to_disk of a DatasetDict
DATASET_MARKERS = ("state.json", "dataset_info.json")  # save_to_disk of one Dataset
TABLE_SUFFIXES = (".parquet", ".arrow")
# where a folder of Parquet / Arrow files keeps them besides its top: the hub's `data/` and split folders
TABLE_DIRS = ("data", "train", "test", *VAL_DIRS)
SPLIT_ROLES = {"train": "train", "test": "test"} | {name: "val" for name in VAL_DIRS}
LABEL_COLUMNS = ("label", "labels", "target", "class")
KEY_COLUMNS = ("id", "image_id", "__key__")  # a column that names each row: its key across loads
SETTING_HINT = "--set data.{}=COLUMN"  # how a user names a column (the recipe's data.* settings)


def claims(spec: str) -> bool:
    """`hf:NAME`, a save_to_disk folder, or a Parquet / Arrow file or folder of them (cheap: names only)."""
    if spec.startswith(HUB_PREFIX):
        return True
    path = Path(spec).expanduser()
    if path.is_file():
        return path.suffix.lower() in TABLE_SUFFIXES
    if not path.is_dir():
        return False
    return _is_saved(path) or bool(_table_files(path))


def load(spec: str, *, seed: int = 0, strict: bool = False, channels: int = 3, allow_download: bool = True,
         image_key: str | None = None, label_key: str | None = None, streaming: str | bool = False) -> DataBundle:
    """`spec` -> DataBundle of the dataset's own splits (`seed` is unused: no split is carved here).
    `streaming`: see `stream`; training and evaluation read a stream's conversion to shards."""
    if is_on(streaming):
        raise DataError(f"{spec}: data.streaming=true reads a dataset once, in order, without downloading it whole: "
                        f"convert it with `vitkit shards {spec} --set data.streaming=true --out DIR`, then train and "
                        "evaluate from DIR (random access: seeded shuffling, exact resume); or leave streaming off")
    with _quiet_progress():
        return _load(spec, strict, channels, allow_download, image_key, label_key)


def is_on(flag: str | bool | None) -> bool:
    """A data setting's yes/no: true/1/yes/on (any case) or True."""
    if isinstance(flag, bool) or flag is None:
        return bool(flag)
    text = str(flag).strip().lower()
    if text not in ("true", "1", "yes", "on", "false", "0", "no", "off", ""):
        raise DataError(f"data.streaming takes true or false, got {flag!r}")
    return text in ("true", "1", "yes", "on")


class Stream:
    """A dataset read once, in order (`stream`): `splits` {bundle split: (dataset split name, its rows)}, each
    row iterated as (key, undecoded image cell {'bytes', 'path'}, label value), `class_names` the ClassLabel's
    names (None when the labels are plain integers or names: their classes are known only after a full pass),
    `image_key` / `label_key` the columns used."""

    def __init__(self, spec: str, splits: dict, image_key: str, label_key: str, key_column: str | None,
                 class_names: list[str] | None):
        self.spec, self.image_key, self.label_key, self.key_column = spec, image_key, label_key, key_column
        self.class_names = class_names
        self._splits = splits

    def roles(self) -> list[str]:
        return list(self._splits)

    def rows(self, role: str) -> Iterator[tuple[str, dict, Any]]:
        name, table = self._splits[role]
        for i, row in enumerate(table):
            key = str(row[self.key_column]) if self.key_column else f"{name}/{i}"
            yield key, row[self.image_key], row[self.label_key]


def stream(spec: str, *, streaming: bool = True, allow_download: bool = True, image_key: str | None = None,
           label_key: str | None = None) -> Stream:
    """`spec`'s rows in order. With `streaming` (datasets' `streaming=True`): a hub dataset row by row over the
    network, never downloaded whole nor converted into the cache; Parquet / Arrow files read in place; a
    save_to_disk folder through `to_iterable_dataset`. Without: the dataset as `load` opens it (downloaded and
    cached), iterated. The columns are found as `load` finds them, from the features."""
    with _quiet_progress():
        splits, _ = _open(spec, allow_download, streaming=streaming)
    roles = _roles(spec, list(splits))
    first = splits[roles["train"]]
    if first.features is None:
        raise DataError(f"{spec}: the stream does not say its columns (no features); read it without streaming")
    image_key = _image_column(spec, first.features, image_key)
    label_key, class_label = _label_column(spec, first.features, label_key)
    key_column = next((c for c in KEY_COLUMNS if c in first.features and c not in (image_key, label_key)), None)
    chosen = {role: (name, _undecoded(splits[name], image_key, keep=[label_key, key_column])) for role, name in roles.items()}
    return Stream(spec, chosen, image_key, label_key, key_column, list(class_label.names) if class_label else None)


def _load(spec: str, strict: bool, channels: int, allow_download: bool, image_key: str | None,
          label_key: str | None) -> DataBundle:
    source = spec if spec.startswith(HUB_PREFIX) else _absolute(spec)
    splits, form = _open(spec, allow_download)
    roles = _roles(spec, list(splits))
    first = splits[roles["train"]]
    image_key = _image_column(spec, first.features, image_key)
    label_key, class_label = _label_column(spec, first.features, label_key)
    key_column = next((c for c in KEY_COLUMNS if c in first.features and c not in (image_key, label_key)), None)
    for name in roles.values():
        missing = [c for c in (image_key, label_key, key_column) if c and c not in splits[name].features]
        if missing:
            raise DataError(f"{spec}: split {name!r} has no column {missing[0]!r} (its columns: "
                            f"{_columns(splits[name].features)})")
        if class_label is not None and splits[name].features[label_key] != class_label:
            # the same index would mean another class in this split
            raise DataError(f"{spec}: split {name!r} names its classes differently from {roles['train']!r} "
                            f"({splits[name].features[label_key]} vs {class_label})")

    raw = {role: _label_values(splits[name], label_key) for role, name in roles.items()}
    if class_label is not None:
        class_names = list(class_label.names)
        to_index = {i: i for i in range(len(class_names))}
    else:
        class_names, to_index = _class_names(raw.values())

    parts: dict[str, HFImages | None] = {"train": None, "val": None, "test": None}
    skipped, unlabeled, sizes = [], {}, set()
    for role, name in roles.items():
        table = splits[name]
        labelled = [row for row, v in enumerate(raw[role]) if v in to_index]
        if len(labelled) < len(table):
            unlabeled[name] = len(table) - len(labelled)
        images = _undecoded(table, image_key)
        good, bad, split_sizes = _verify(images, image_key, labelled, name, channels, strict, spec)
        skipped += bad
        sizes |= split_sizes
        if not good:
            continue  # an unlabelled test split (every label -1): not a split to score on
        keys = _keys(table, key_column, name, good)
        labels = [to_index[raw[role][row]] for row in good]
        parts[role] = HFImages(images, image_key, good, labels, keys, channels, f"{spec} [{name}]")
    if skipped:
        log.warning("%s: skipped %d unreadable image(s), e.g. %s", spec, len(skipped), skipped[0]["reason"])
    if parts["train"] is None:
        raise DataError(f"{spec}: no training images: the {roles['train']!r} split has no readable, labelled rows")
    info: dict[str, Any] = {"source": source, "format": form, "image_key": image_key, "label_key": label_key,
                            "key_column": key_column, "splits": {role: name for role, name in roles.items()},
                            "skipped": skipped, "num_skipped": len(skipped)}
    if unlabeled:
        info["unlabeled"] = unlabeled
    if ignored := [s for s in splits if s not in roles.values()]:
        info["ignored_splits"] = ignored
    size = next(iter(sizes))[::-1] if len(sizes) == 1 else None  # PIL (W, H) -> (H, W)
    return DataBundle(source, class_names, channels, size, parts["train"], parts["val"], parts["test"], info)


class HFImages(Dataset):
    """Rows of a Hugging Face dataset decoded on access: the image cell ({'bytes', 'path'}, undecoded) by vitkit's
    decoder into mode L or RGB as `channels` asks; `rows` are the dataset rows this split holds."""

    def __init__(self, table, image_key: str, rows: Sequence[int], labels: Sequence[int], keys: Sequence[str],
                 channels: int, where: str):
        self.table, self.image_key, self.channels, self.where = table, image_key, channels, where
        self.rows = np.asarray(rows, dtype=np.int64)
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self._keys = list(keys)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = int(self.rows[i])
        cell = self.table[row][self.image_key]
        return decode_cell(cell, self.channels, f"{self.where} row {row}"), int(self.labels[i])

    def subset(self, idx: Sequence[int]) -> HFImages:
        idx = list(idx)
        return HFImages(self.table, self.image_key, self.rows[idx], self.labels[idx], [self._keys[i] for i in idx],
                        self.channels, self.where)

    def keys(self) -> list[str]:
        return list(self._keys)


def decode_cell(cell: dict | None, channels: int, name: str):
    """An undecoded `datasets.Image` cell -> PIL image, or ImageError: its bytes by `decode_image` (the checks
    and conversions of a file), else the file it points to by `load_image`."""
    cell = cell or {}
    if cell.get("bytes"):
        return decode_image(cell["bytes"], channels, name=name)
    if cell.get("path"):
        return load_image(cell["path"], channels)
    raise ImageError(f"{name}: the row has no image (neither bytes nor a path)")


# ---------------------------------------------------------------------------- reading the dataset
def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("Hugging Face datasets as --data need the datasets package: pip install 'vitkit[hf]' "
                        "(or datasets)") from None
    return datasets


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """datasets' progress bars off while it loads (a run prints its own progress); restored afterwards."""
    datasets = _datasets()
    was_on = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def _is_saved(path: Path) -> bool:
    return (path / DATASET_DICT_MARKER).is_file() or all((path / m).is_file() for m in DATASET_MARKERS)


def _table_files(folder: Path) -> list[Path]:
    """Parquet / Arrow files at the folder's top and in its TABLE_DIRS (not deeper: a class-folder tree of
    images is not walked)."""
    found = []
    for d in (folder, *(folder / name for name in TABLE_DIRS)):
        if d.is_dir():
            found += [p for p in d.iterdir() if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES]
    return sorted(found)


def _open(spec: str, allow_download: bool, streaming: bool = False) -> tuple[dict, str]:
    """-> ({split name: datasets.Dataset, or an IterableDataset with `streaming`}, format)."""
    datasets = _datasets()
    if spec.startswith(HUB_PREFIX):
        return _splits(_from_hub(spec, allow_download, streaming=streaming)), "hub"
    path = Path(spec).expanduser()
    try:
        if path.is_dir() and _is_saved(path):
            saved = _splits(datasets.load_from_disk(str(path)))
            return ({n: d.to_iterable_dataset() for n, d in saved.items()} if streaming else saved), "save_to_disk"
        files = [path] if path.is_file() else _table_files(path)
        form = "parquet" if any(p.suffix.lower() == ".parquet" for p in files) else "arrow"
        where = {"data_files": str(path)} if path.is_file() else {"data_dir": str(path)}
        return _splits(datasets.load_dataset(form, streaming=streaming, **where)), form
    except (DataError, OfflineError):
        raise
    except Exception as e:  # noqa: BLE001  datasets and pyarrow raise many types for unreadable files
        raise DataError(f"{spec}: cannot read it as a Hugging Face dataset ({type(e).__name__}: {_one_line(e)})") \
            from None


def _splits(loaded) -> dict:
    """A DatasetDict or one Dataset -> {split name: Dataset} (a lone Dataset is the training split)."""
    return dict(loaded) if hasattr(loaded, "keys") else {"train": loaded}


def _from_hub(spec: str, allow_download: bool, streaming: bool = False):
    """`hf:NAME[:CONFIG]` through `datasets.load_dataset`, from the cache only when the hub cannot be reached."""
    from ..weights.hub import _is_transport_error

    datasets = _datasets()
    name, _, config = spec[len(HUB_PREFIX):].partition(":")
    if not name:
        raise DataError(f"{spec}: name a hub dataset: hf:NAME or hf:NAME:CONFIG")
    cache = datasets.config.HF_DATASETS_CACHE
    local = ("Download it where there is a network (the same cache layout), or give a local copy as --data: a "
             "save_to_disk folder or Parquet files")
    why = ("offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)" if datasets.config.HF_HUB_OFFLINE else "VITKIT_OFFLINE is set"
           if os.environ.get("VITKIT_OFFLINE") else "downloads are off" if not allow_download else "")
    if not why:
        from huggingface_hub import HfApi
        from huggingface_hub import errors as hub_errors

        try:  # one request, no retries: an unreachable hub is known at once
            HfApi().dataset_info(name, timeout=5)
        except hub_errors.GatedRepoError:
            pass  # it exists: load_dataset says what access it needs
        except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError):
            raise DataError(f"{spec}: no dataset {name!r} on the hub (or it is private)") from None
        except Exception as e:  # noqa: BLE001  anything but an unreachable hub is left to load_dataset
            if _is_transport_error(e):
                why = f"the hub is not reachable ({type(e).__name__})"
    if streaming and why:  # a stream reads the hub as it goes: nothing in the cache to fall back on
        raise OfflineError(f"{spec}: cannot stream hub dataset {name!r}: {why}. Streaming reads the hub row by row; "
                           f"{local}")
    try:
        with _cache_only(bool(why)):
            return datasets.load_dataset(name, config or None, streaming=streaming)
    except ConnectionError as e:
        raise OfflineError(f"{spec}: could not get hub dataset {name!r}: it is not in the cache at {cache} and "
                           f"{why or 'the hub is not reachable'} ({_one_line(e)}). {local}") from None
    except Exception as e:  # noqa: BLE001  an unknown config, a gated dataset, a broken cache entry, ...
        raise DataError(f"{spec}: could not load hub dataset {name!r} ({type(e).__name__}: {_one_line(e)})") \
            from None


@contextlib.contextmanager
def _cache_only(on: bool) -> Iterator[None]:
    """datasets' offline mode for one load: it then reads a cached dataset without a request (its flag is read
    from the environment at import, so it is set on the module for the call and restored)."""
    from datasets import config

    saved = config.HF_HUB_OFFLINE
    config.HF_HUB_OFFLINE = saved or on
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE = saved


def _roles(spec: str, names: list[str]) -> dict[str, str]:
    """The dataset's split names -> {bundle split (train / val / test): dataset split}; other names are ignored
    when there is a train split (SVHN's `extra`, IMDB's `unsupervised`), refused when there is none."""
    roles: dict[str, str] = {}
    for name in names:
        role = SPLIT_ROLES.get(name.lower())
        if role is None:
            continue
        if role in roles:
            raise DataError(f"{spec}: splits {roles[role]!r} and {name!r} both name the {role} split; keep one")
        roles[role] = name
    if "train" not in roles:
        raise DataError(f"{spec}: no train split: its split(s) are {', '.join(map(repr, names))}; vitkit reads "
                        f"train, {'|'.join(VAL_DIRS)} (validation) and test")
    if ignored := [n for n in names if n not in roles.values()]:
        log.warning("%s: split(s) %s ignored (vitkit reads train, validation, test)", spec, ", ".join(ignored))
    return roles


def _columns(features) -> str:
    return ", ".join(f"{name} ({_kind(f)})" for name, f in features.items()) or "none"


def _kind(feature) -> str:
    """A feature in a few words: `Value int64`, `Image`, `ClassLabel`, `List`."""
    from datasets import Value

    return f"Value {feature.dtype}" if isinstance(feature, Value) else type(feature).__name__


def _image_column(spec: str, features, image_key: str | None) -> str:
    from datasets import Image

    if image_key is not None:
        if image_key not in features:
            raise DataError(f"{spec}: no column {image_key!r} (data.image_key); its columns: {_columns(features)}")
        if not isinstance(features[image_key], Image):
            raise DataError(f"{spec}: column {image_key!r} is {_kind(features[image_key])}, not an Image feature")
        return image_key
    found = [name for name, f in features.items() if isinstance(f, Image)]
    if not found:
        raise DataError(f"{spec}: no image column (a datasets.Image feature); its columns: {_columns(features)}")
    if len(found) > 1:
        log.warning("%s: image columns %s: using %r (%s)", spec, found, found[0], SETTING_HINT.format("image_key"))
    return found[0]


def _label_column(spec: str, features, label_key: str | None):
    """-> (the label column, its ClassLabel feature or None)."""
    from datasets import ClassLabel, Value

    def usable(name: str) -> bool:
        f = features[name]
        return isinstance(f, ClassLabel) or (isinstance(f, Value) and _is_class_dtype(f.dtype, named=label_key))

    if label_key is not None:
        if label_key not in features:
            raise DataError(f"{spec}: no column {label_key!r} (data.label_key); its columns: {_columns(features)}")
        if not usable(label_key):
            raise DataError(f"{spec}: column {label_key!r} is {_kind(features[label_key])}: labels must be a "
                            "ClassLabel, integers or class names")
        chosen = label_key
    else:
        chosen = next((n for n, f in features.items() if isinstance(f, ClassLabel)), None) or next(
            (n for n in LABEL_COLUMNS if n in features and usable(n)), None)
    if chosen is None:
        raise DataError(f"{spec}: no label column (a ClassLabel feature, or an integer column named "
                        f"{'/'.join(LABEL_COLUMNS)}); its columns: {_columns(features)}; name one with "
                        f"{SETTING_HINT.format('label_key')}")
    return chosen, features[chosen] if isinstance(features[chosen], ClassLabel) else None


def _is_class_dtype(dtype: str, named: str | None) -> bool:
    """Integers are classes; strings only in a column the user named (a detected `label` of text is too often
    a caption)."""
    return dtype.startswith(("int", "uint")) or (named is not None and dtype in ("string", "large_string"))


def _label_values(table, label_key: str) -> list:
    return table.with_format("arrow")[label_key].to_pylist()


def _class_names(values_per_split) -> tuple[list[str], dict]:
    """Sorted distinct labels (numerically for integers) -> (class names, {value: class index})."""
    distinct = sorted({v for values in values_per_split for v in values if v is not None})
    return [str(v) for v in distinct], {v: i for i, v in enumerate(distinct)}


def _undecoded(table, image_key: str, keep: Sequence[str | None] = ()):
    """Only the image column (and the `keep` columns), the image left undecoded ({'bytes', 'path'}): vitkit
    decodes it (datasets' decoding has no decompression-bomb limit and drops alpha unlike a file read by
    vitkit). Both steps are views, not copies."""
    from datasets import Image

    columns = [image_key, *dict.fromkeys(c for c in keep if c)]
    return table.select_columns(columns).cast_column(image_key, Image(decode=False))


def _verify(images, image_key: str, rows: list[int], split: str, channels: int, strict: bool,
            spec: str) -> tuple[list[int], list[dict], set]:
    """Decode each of `rows` once -> (the readable rows, the skipped ones with why, the image sizes (W, H))."""
    good, bad, sizes = [], [], set()
    batch = 256
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        for row, cell in zip(chunk, images[chunk][image_key]):
            try:
                sizes.add(decode_cell(cell, channels, f"{spec} [{split}] row {row}").size)
                good.append(row)
            except ImageError as e:
                if strict:
                    raise DataError(f"{e} (--strict stops at the first unreadable image)") from None
                bad.append({"row": f"{split}/{row}", "reason": str(e)})
    return good, bad, sizes


def _keys(table, key_column: str | None, split: str, rows: list[int]) -> list[str]:
    """A stable key per row: its id column's value, else the split and row index."""
    if key_column is None:
        return [f"{split}/{row}" for row in rows]
    values = table.with_format("arrow")[key_column].to_pylist()
    return [str(values[row]) for row in rows]
