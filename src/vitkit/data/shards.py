"""WebDataset tar shards as a `--data` source, read by random access; and `write_shards`, what `vitkit shards`
runs to convert a folder or CSV manifest into them.

Specs (`claims`): a brace pattern `shards/{000..099}.tar` (or a glob `shards/*.tar`), one `.tar`, a folder
holding `.tar` files (directly or in `train/`, `val/`, `test/` folders), or a list file (`.shards`, or a `.txt`
whose first line names a `.tar`) of shard paths, one a line, relative to the list.

Samples are grouped as WebDataset groups them: the member `train/000012.png` is field `png` of sample
`train/000012` (the key is the member name up to the first dot of its base name). A sample's image is its
`jpg`, `jpeg`, `png` or `webp` member (else any other extension Pillow reads); its label is `label_key`: a
member (`cls`: an integer, `txt`: a class name) or, when the sample has no member of that name, a field of its
`json` dict. By default the first of `cls`, `txt` that the first sample has, else the `json` field `label`.

Reading is random access, as WebDataset's indexed reader (wids) does it: one pass over each tar reads the
member headers (offsets and sizes, never the image bytes) and the small label members; an image is read
from its byte range and decoded when the sample is asked for. So the dataset is map-style: the seeded
sampler, the DDP split, DataLoader workers and the epoch-exact resume apply as to a folder, and no image is
held in memory. Compressed shards (`.tar.gz`) have no byte ranges and are refused.

Splits: a shard whose path below the spec's folder has a word `train`, `val` (`valid`, `validation`) or
`test` (`train-000.tar`, `val/000.tar`) belongs to that split; any other shard to train. Class names come
from a `classes.json` / `classes.txt` beside the shards (or in the folder above them; what `write_shards`
writes) or are the sorted distinct label values.

A corrupt tar (an unreadable header) or a member cut off by the end of the file is skipped and counted in
`info['skipped']`, or stops the load with `strict`; an image whose bytes do not decode raises `ImageError`
when it is read (checking every image at load time would read every byte of every shard).
"""
from __future__ import annotations

import glob
import io
import itertools
import json
import logging
import os
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import ConfigError, DataError
from .bundle import DataBundle

log = logging.getLogger("vitkit")

# WebDataset's own image fields first: a sample holding two images is read by the one WebDataset would use
PREFERRED_IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")
DEFAULT_LABEL_FIELDS = ("cls", "txt")  # then the `json` dict's DEFAULT_JSON_LABEL
DEFAULT_JSON_LABEL = "label"
CLASS_FILES = ("classes.json", "classes.txt")
SHARD_SUFFIX = ".tar"
LIST_SUFFIX = ".shards"  # a list of shard paths, one a line (or a .txt whose first line names a .tar)
_SPLIT_WORDS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
# a split word not inside a longer word: `train-000`, `val_3`, `test` count; `training`, `interval` do not
_SPLIT_WORD = re.compile(r"(?<![a-z])(train|validation|valid|val|test)(?![a-z])")
_TAR_BLOCK = 512


# ---------------------------------------------------------------------------- which specs are shards
def claims(spec: str) -> bool:
    """Cheap: the spec's shape, a suffix, the first line of a list file, or `.tar` files in a folder."""
    spec = str(spec)
    if _is_pattern(spec):
        return True
    path = Path(spec).expanduser()
    try:
        if path.is_file():
            suffix = path.suffix.lower()
            # a .txt may be a CSV manifest (datasets.py reads those): a shard list's first line names a .tar
            return suffix in (SHARD_SUFFIX, LIST_SUFFIX) or suffix == ".txt" and _first_line_names_a_tar(path)
        if path.is_dir():
            return any(_tars_in(d) for d in (path, *(path / s for s in ("train", *_val_dirs(), "test"))))
    except OSError:
        return False
    return False


def _is_pattern(spec: str) -> bool:
    """A brace or glob pattern of shards: `{000..099}.tar`, `{a,b}.tar`, `*.tar`."""
    return spec.lower().endswith(SHARD_SUFFIX) and any(c in spec for c in "{*?[")


def _first_line_names_a_tar(path: Path) -> bool:
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace").strip()
            if line and not line.startswith("#"):
                return line.lower().endswith(SHARD_SUFFIX)
    return False


def _val_dirs() -> tuple[str, ...]:
    from .datasets import VAL_DIRS

    return VAL_DIRS


def _tars_in(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(SHARD_SUFFIX)
                  and not p.name.startswith("."))


def resolve_shards(spec: str) -> tuple[Path, list[Path]]:
    """`spec` -> (the folder split words and class files are looked for from, the shard files in order)."""
    spec = str(spec)
    if _is_pattern(spec):
        root = _pattern_root(spec)
        names = _expand(spec)
        missing = [n for n in names if not Path(n).expanduser().is_file()]
        if len(missing) == len(names):
            raise DataError(f"{spec}: the pattern matches no shard (e.g. {missing[0]} does not exist)")
        if missing:
            raise DataError(f"{spec}: {len(missing)} of the {len(names)} shards the pattern names do not exist, "
                            f"e.g. {missing[0]}")
        return root, [Path(n).expanduser().absolute() for n in names]
    path = Path(spec).expanduser().absolute()
    if path.is_dir():
        shards = [p for d in (path, *(path / s for s in ("train", *_val_dirs(), "test"))) for p in _tars_in(d)]
        if not shards:
            raise DataError(f"{spec}: the folder holds no {SHARD_SUFFIX} shards")
        return path, shards
    if path.suffix.lower() == SHARD_SUFFIX:
        return path.parent, [path]
    return path.parent, _listed_shards(path)


def _pattern_root(spec: str) -> Path:
    """The folder a pattern's fixed part names: `data/shards/train-{0..9}.tar` -> data/shards."""
    fixed = re.split(r"[{*?\[]", spec, maxsplit=1)[0]
    return Path(fixed if fixed.endswith(os.sep) else os.path.dirname(fixed) or ".").expanduser().absolute()


def _expand(spec: str) -> list[str]:
    if "{" in spec:
        try:
            from braceexpand import braceexpand
        except ImportError:
            raise DataError("brace patterns of shards need braceexpand: pip install 'vitkit[shards]' (or braceexpand)"
                            ) from None
        names = list(braceexpand(spec))
    else:
        names = [spec]
    expanded = []
    for name in names:  # a glob part (`*.tar`) matches files in sorted order, as a folder's shards are read
        globbed = any(c in name for c in "*?[")
        expanded += sorted(glob.glob(os.path.expanduser(name))) if globbed else [name]
    if not expanded:
        raise DataError(f"{spec}: the pattern matches no shard")
    return expanded


def _listed_shards(path: Path) -> list[Path]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable shard list ({e})") from None
    shards = [(path.parent / line.strip()).absolute() for line in lines
              if line.strip() and not line.strip().startswith("#")]
    if not shards:
        raise DataError(f"{path}: the shard list names no shard")
    missing = [p for p in shards if not p.is_file()]
    if missing:
        raise DataError(f"{path}: {len(missing)} listed shard(s) do not exist, e.g. {missing[0]}")
    return shards


def split_of(shard: Path, root: Path) -> str:
    """train | val | test by the split words of the shard's path below `root` (train when it has none)."""
    try:
        rel = shard.relative_to(root)
    except ValueError:
        rel = Path(shard.name)
    for part in reversed(rel.parts):  # the file's own name first, then its folders upwards
        found = _SPLIT_WORD.search(part.lower())
        if found:
            return _SPLIT_WORDS[found.group(1)]
    return "train"


# ---------------------------------------------------------------------------- reading one shard's headers
class _ShardIndex:
    """What one header pass over a shard found: per sample its key, image field, the image's byte range and
    its label value; and what was skipped."""

    def __init__(self):
        self.keys: list[str] = []
        self.image_fields: list[str] = []
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.label_values: list[int | str] = []
        self.skipped: list[dict] = []


def split_member_name(name: str) -> tuple[str | None, str | None]:
    """WebDataset's rule: `dir/key.seg.png` -> (`dir/key`, `seg.png`); (None, None) for a name with no dot."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (match.group(1), match.group(2)) if match else (None, None)


def _image_field(fields: dict[str, tarfile.TarInfo]) -> str | None:
    from .images import IMAGE_EXTENSIONS

    for f in PREFERRED_IMAGE_FIELDS:
        if f in fields:
            return f
    others = sorted(f for f in fields if f".{f}" in IMAGE_EXTENSIONS)
    return others[0] if others else None


class _Damage:
    """Where a shard is unreadable: members cut off by the end of the file (by sample key) and a corrupt or
    truncated tail (after which members are lost), each with its reason."""

    def __init__(self, shard: Path, strict: bool):
        self.shard, self.strict = shard, strict
        self.cut: dict[str, str] = {}  # sample key -> why it is incomplete
        self.tail: str | None = None

    def note(self, reason: str, member: str | None = None) -> None:
        if self.strict:
            where = f"{self.shard}:{member}" if member else str(self.shard)
            raise DataError(f"{where}: {reason} (--strict stops at the first unreadable shard member)")
        if member is None:
            self.tail = reason
        else:
            self.cut.setdefault(split_member_name(member)[0] or member, f"{member}: {reason}")


def _members(shard: Path, damage: _Damage) -> list[tarfile.TarInfo]:
    """The regular-file members of `shard` whose bytes all lie inside the file (headers only: tarfile seeks
    from header to header of an uncompressed tar without reading the data)."""
    size = shard.stat().st_size
    if size == 0:
        raise DataError(f"{shard}: empty shard (0 bytes)")
    with open(shard, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise DataError(f"{shard}: a gzip-compressed shard cannot be read by random access; store shards as "
                            "plain .tar (gunzip it)")
    found: list[tarfile.TarInfo] = []
    truncated = None
    try:
        with tarfile.open(shard, mode="r:") as tar:
            try:
                for member in tar:
                    if member.isfile():
                        found.append(member)
                end = tar.offset
            except tarfile.ReadError as e:  # the file ends inside a header, or inside data before the next one
                truncated, end = f"truncated tar after {len(found)} member(s) ({e})", None
    except tarfile.ReadError as e:
        damage.note(f"not a readable tar file ({e})")
        return []
    whole = [m for m in found if m.offset_data + m.size <= size]
    cut = [m for m in found if m.offset_data + m.size > size]
    for m in cut:
        damage.note(f"cut off by the end of the file ({max(size - m.offset_data, 0)} of {m.size} bytes)", m.name)
    if truncated and not cut:  # the file ends inside a header rather than inside a member's bytes
        damage.note(truncated)
    if end is not None:
        # tarfile ends the archive silently at an invalid header after the first: anything but the
        # end-of-archive zeros there is a corrupt header, and the members behind it are lost
        with open(shard, "rb") as f:
            f.seek(end)
            block = f.read(_TAR_BLOCK)
        if block.strip(b"\0"):
            damage.note(f"corrupt tar header at byte {end}; the members after it are unreadable")
    return whole


def index_shard(shard: Path, label_key: str | None, strict: bool) -> tuple[_ShardIndex, str | None]:
    """One pass over `shard`'s headers (and its small label members) -> (its samples, the label field they
    were read by). `label_key` None picks the default from the first sample: the first of
    DEFAULT_LABEL_FIELDS it has, else its json field DEFAULT_JSON_LABEL."""
    out = _ShardIndex()
    damage = _Damage(shard, strict)
    samples: dict[str, dict[str, tarfile.TarInfo]] = {}
    for m in _members(shard, damage):
        key, field_name = split_member_name(m.name)
        if key is None or Path(key).name.startswith("."):
            continue  # not a sample member (WebDataset skips them too): a README, `._` resource forks
        samples.setdefault(key, {})[field_name.lower()] = m
    if damage.tail:
        out.skipped.append({"path": str(shard), "reason": damage.tail})
    out.skipped += [{"path": f"{shard}:{key}", "reason": reason} for key, reason in damage.cut.items()]
    if not samples and not damage.tail and not damage.cut:
        raise DataError(f"{shard}: empty shard (no samples)")
    last = next(reversed(samples), None)
    with open(shard, "rb") as f:
        for key, fields in samples.items():
            if key in damage.cut:  # counted above, whether or not its other members survived
                continue
            image = _image_field(fields)
            if label_key is None:
                label_key = next((f for f in DEFAULT_LABEL_FIELDS if f in fields), DEFAULT_JSON_LABEL)
            label = _label(shard, key, fields, label_key, f.fileno())
            if image is None or label is None:
                if damage.tail and key == last:  # its other members lay behind the damage
                    out.skipped.append({"path": f"{shard}:{key}", "reason": f"incomplete sample ({damage.tail})"})
                    continue
                if image is None:
                    raise DataError(f"{shard}: sample {key!r} has no image (fields: {', '.join(sorted(fields))}; "
                                    f"expected one of {', '.join(PREFERRED_IMAGE_FIELDS)})")
                raise DataError(f"{shard}: sample {key!r} has no label: no .{label_key} member"
                                + (f" and no {label_key!r} field in its .json" if "json" in fields else "")
                                + f" (fields: {', '.join(sorted(fields))}); name the label field with "
                                "--set data.label_key=...")
            out.keys.append(key)
            out.image_fields.append(image)
            out.offsets.append(fields[image].offset_data)
            out.sizes.append(fields[image].size)
            out.label_values.append(label)
    return out, label_key


def _label(shard: Path, key: str, fields: dict[str, tarfile.TarInfo], label_key: str, fd: int) -> int | str | None:
    """The sample's label: its member `label_key` (`cls`: an integer; any other: a class name), else the field
    `label_key` of its `json` dict (an integer or a name); None when it has neither."""
    def read(member: tarfile.TarInfo) -> bytes:
        return os.pread(fd, member.size, member.offset_data)

    where = f"{shard}: sample {key!r}"
    if label_key in fields:
        text = read(fields[label_key]).decode("utf-8", "replace").strip()
        if label_key == "cls":
            try:
                return int(text)
            except ValueError:
                raise DataError(f"{where}: its .cls holds {text[:40]!r}, not an integer class") from None
        return text or None
    if "json" not in fields:
        return None
    try:
        meta = json.loads(read(fields["json"]))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: its .json is not valid JSON ({e})") from None
    value = meta.get(label_key) if isinstance(meta, dict) else None
    if value is None or isinstance(value, str) and not value.strip():
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise DataError(f"{where}: its json field {label_key!r} is {value!r}, not a class (an integer or a name)")
    return value.strip() if isinstance(value, str) else value


# ---------------------------------------------------------------------------- the dataset
class ShardImages(Dataset):
    """Samples of tar shards, each image read from its byte range and decoded on access by `decode_image`
    (the checks and conversions of `load_image`, so a shard gives the pixels its source file gives).

    `shards` is shared by every subset; per sample, numpy arrays of the shard number and byte range keep a
    million-sample index small. `keys()` are the samples' WebDataset keys."""

    def __init__(self, shards: Sequence[str], shard_ids, offsets, sizes, image_fields: Sequence[str],
                 keys: Sequence[str], labels, channels: int = 3):
        self.shards = shards
        self.shard_ids = np.asarray(shard_ids, dtype=np.int32)  # [N]
        self.offsets = np.asarray(offsets, dtype=np.int64)  # [N] where the image bytes start in the tar
        self.sizes = np.asarray(sizes, dtype=np.int64)  # [N]
        self.image_fields, self.sample_keys = list(image_fields), list(keys)
        self.labels = torch.as_tensor(labels, dtype=torch.long)  # [N]
        self.channels = channels
        self._files: dict[int, int] = {}  # shard number -> an open descriptor of this process
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.labels)

    def read_bytes(self, i: int) -> bytes:
        """Sample i's image bytes, as its tar holds them."""
        if self._pid != os.getpid():  # a forked DataLoader worker opens its own (pread needs no shared offset)
            self._files, self._pid = {}, os.getpid()
        shard = int(self.shard_ids[i])
        fd = self._files.get(shard)
        if fd is None:
            fd = self._files[shard] = os.open(self.shards[shard], os.O_RDONLY)
        size = int(self.sizes[i])
        data = os.pread(fd, size, int(self.offsets[i]))
        if len(data) != size:
            from ..errors import ImageError

            raise ImageError(f"{self.where(i)}: the shard was cut short ({len(data)} of {size} bytes readable)")
        return data

    def where(self, i: int) -> str:
        """Where sample i's image lives, in words: `SHARD:KEY.FIELD`."""
        return f"{self.shards[int(self.shard_ids[i])]}:{self.sample_keys[i]}.{self.image_fields[i]}"

    def __getitem__(self, i: int):
        from .images import decode_image

        return decode_image(self.read_bytes(i), self.channels, name=self.where(i)), int(self.labels[i])

    def subset(self, idx: Sequence[int]) -> ShardImages:
        idx = np.asarray(idx, dtype=np.int64)
        return ShardImages(self.shards, self.shard_ids[idx], self.offsets[idx], self.sizes[idx],
                           [self.image_fields[i] for i in idx], [self.sample_keys[i] for i in idx],
                           self.labels[torch.as_tensor(idx)], self.channels)

    def keys(self) -> list[str]:
        return list(self.sample_keys)

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_files": {}}  # descriptors do not travel to a spawned worker

    def __del__(self):
        try:
            if self._pid == os.getpid():  # a forked worker's inherited descriptors close when it exits
                for fd in self._files.values():
                    os.close(fd)
        except Exception:  # noqa: BLE001, S110  interpreter shutdown, or a descriptor already closed
            pass


# ---------------------------------------------------------------------------- the bundle
def load(spec, *, seed: int = 0, strict: bool = False, channels: int = 3, allow_download: bool = True,
         label_key: str | None = None) -> DataBundle:
    """Index every shard `spec` names (headers and label members only) into train / val / test ShardImages.
    `seed` and `allow_download` are unused: shards are local and split by their names."""
    from .datasets import _absolute

    root, shards = resolve_shards(str(spec))
    per_split: dict[str, list[tuple[int, _ShardIndex]]] = {"train": [], "val": [], "test": []}
    skipped: list[dict] = []
    for n, shard in enumerate(shards):
        found, label_key = index_shard(shard, label_key, strict)
        skipped += found.skipped
        per_split[split_of(shard, root)].append((n, found))
    if skipped:
        log.warning("%s: skipped %d unreadable shard part(s), e.g. %s: %s", spec, len(skipped), skipped[0]["path"],
                    skipped[0]["reason"])
    values = [v for parts in per_split.values() for _, found in parts for v in found.label_values]
    if not values:
        raise DataError(f"{spec}: no readable samples in {len(shards)} shard(s)")
    meta = _class_file(root, shards)
    names, label_of = _classes(spec, values, meta.get("classes"))
    paths = [str(s) for s in shards]
    splits = {split: _join(paths, parts, label_of, channels) if parts else None for split, parts in per_split.items()}
    if splits["train"] is None:
        raise DataError(f"{spec}: no training shards (only {', '.join(s for s, d in splits.items() if d)}); a shard "
                        "without a split word in its name or folder is a training shard")
    all_keys = [k for d in splits.values() if d is not None for k in d.sample_keys]
    duplicates = len(all_keys) - len(set(all_keys))
    if duplicates:  # they still load, but a key no longer names one image (embed rows, shared-image checks)
        log.warning("%s: %d sample key(s) occur more than once across the shards", spec, duplicates)
    size = meta.get("image_size")
    info = {"source": _absolute(spec), "shards": len(shards), "label_key": label_key, "skipped": skipped,
            "num_skipped": len(skipped), "duplicate_keys": duplicates}
    return DataBundle(_absolute(spec), names, channels, tuple(size) if size else None, splits["train"],
                      splits["val"], splits["test"], info)


def _join(paths: list[str], parts: list[tuple[int, _ShardIndex]], label_of, channels: int) -> ShardImages:
    """The samples of a split's shards (shard number, index) as one ShardImages, in shard order."""
    def each(attr: str) -> list:
        return [v for _, found in parts for v in getattr(found, attr)]

    shard_ids = [n for n, found in parts for _ in found.keys]
    return ShardImages(paths, shard_ids, each("offsets"), each("sizes"), each("image_fields"), each("keys"),
                       [label_of(v) for v in each("label_values")], channels)


def _class_file(root: Path, shards: list[Path]) -> dict[str, Any]:
    """classes.json ({"classes": [...], "image_size": [H, W]} as write_shards writes it, or a list) or
    classes.txt (a name a line) in the spec's folder, the shards' folder or the one above it -> a dict."""
    folders = dict.fromkeys([root, shards[0].parent, shards[0].parent.parent])
    for folder in folders:
        for name in CLASS_FILES:
            path = folder / name
            if not path.is_file():
                continue
            try:
                text = path.read_text()
                found = json.loads(text) if name.endswith(".json") else [line.strip() for line in text.splitlines()
                                                                        if line.strip()]
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise DataError(f"{path}: unreadable class list ({e})") from None
            meta = found if isinstance(found, dict) else {"classes": found}
            classes = meta.get("classes")
            if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
                raise DataError(f"{path}: expected a list of class names (or {{\"classes\": [...]}})")
            return meta | {"path": str(path)}
    return {}


def _classes(spec, values: list[int | str], listed: list[str] | None):
    """-> (class names, label value -> class index). Integers index a listed class file; names are looked up
    in it; without one the classes are the sorted distinct values (integers in numeric order)."""
    kinds = {type(v) for v in values}
    if len(kinds) > 1:
        raise DataError(f"{spec}: labels mix integers and names; give every sample the same kind of label")
    if listed:
        if int in kinds:
            bad = sorted({v for v in values if not 0 <= v < len(listed)})
            if bad:
                raise DataError(f"{spec}: label(s) {bad[:5]} outside the {len(listed)} listed classes")
            return list(listed), int
        unknown = sorted(set(values) - set(listed))
        if unknown:
            raise DataError(f"{spec}: label(s) {unknown[:5]} are not in the class list {listed[:10]}")
        position = {c: i for i, c in enumerate(listed)}
        return list(listed), position.__getitem__
    distinct = sorted(set(values))
    position = {v: i for i, v in enumerate(distinct)}
    return [str(v) for v in distinct], position.__getitem__


# ---------------------------------------------------------------------------- writing shards
def write_shards(src: str, out: str | os.PathLike, per_shard: int, *, strict: bool = False,
                 overwrite: bool = False, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A folder of class folders (per split when it has train/ val/ test/), a CSV manifest or a Hugging Face
    dataset (read in order, streamed with options {"streaming": "true"}) -> tar shards
    `OUT/{split}-{000000..}.tar` of `per_shard` samples each, plus OUT/classes.json.

    Each sample `{split}/{index}` holds the source image's bytes unchanged (`.png`, `.jpg`, ...), its class
    index (`.cls`) and `.json` {"label": name, "source": path or row key}; members are written in the source's
    order with fixed metadata, so the same source gives byte-identical shards. Every image is decoded once
    (unreadable ones skipped and counted, or stop with strict, as `load_data` does); each shard and the class
    file are written atomically (a temp file renamed). A stream whose labels are not a ClassLabel has no class
    list until it has been read whole: its samples carry the label in `.json` only, and the classes are the
    sorted distinct labels when the shards are read (as for any shards without a class file)."""
    from .._files import atomic_write_text
    from . import hf_datasets

    if per_shard < 1:
        raise DataError(f"--per-shard must be at least 1, got {per_shard}")
    if claims(str(src)):
        raise DataError(f"{src}: already shards; give a folder of class folders, a CSV manifest or a dataset")
    options = dict(options or {})
    if hf_datasets.claims(str(src)):
        samples, classes, source, image_size, skipped = _dataset_samples(str(src), strict, options)
    else:
        if options:
            raise ConfigError(f"--set data.{next(iter(options))}: {src} takes no data options (a folder or CSV)")
        samples, classes, source, image_size, skipped = _file_samples(str(src), strict)
    out = Path(out)
    old = _tars_in(out) + [out / n for n in CLASS_FILES if (out / n).is_file()]
    if old and not overwrite:
        raise DataError(f"{out} already holds shards; pass --overwrite to replace them, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    written, counts, new = {}, {}, set()
    for split, rows in samples.items():
        shards, count = _write_split(out, split, rows, per_shard)
        if count:
            written[split], counts[split] = len(shards), count
            new |= set(shards)
    if "train" not in counts:
        raise DataError(f"{src}: no training samples to write (every one was unreadable or unlabelled)")
    meta = {"classes": classes, "image_size": list(image_size()) if image_size() else None, "source": source,
            "samples": counts, "shards": written, "per_shard": per_shard}
    if classes:  # else the labels in each sample's .json are the classes (module docstring)
        atomic_write_text(out / CLASS_FILES[0], json.dumps(meta, indent=1))
        new.add(out / CLASS_FILES[0])
    for path in old:  # what a larger earlier conversion left would otherwise join this one's splits
        if path not in new:
            path.unlink()
    return meta | {"out": str(out), "skipped": skipped, "num_skipped": len(skipped)}


def _write_split(out: Path, split: str, rows, per_shard: int) -> tuple[list[Path], int]:
    """Write one split's samples (suffix, image bytes, class index or None, the .json dict) as shards of
    `per_shard`; -> (the shards written, the sample count). Keys are `{split}/{index}`, six digits at least."""
    from .._files import atomic_path

    shards, count, rows = [], 0, iter(rows)
    while chunk := list(itertools.islice(rows, per_shard)):  # a stream's length is known only at its end
        shard = out / f"{split}-{len(shards):06d}.tar"
        with atomic_path(shard) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for suffix, data, label, about in chunk:
                key = f"{split}/{count:06d}"
                _add(tar, f"{key}{suffix}", data)
                if label is not None:
                    _add(tar, f"{key}.cls", str(label).encode())
                _add(tar, f"{key}.json", json.dumps(about).encode())
                count += 1
        shards.append(shard)
    return shards, count


def _file_samples(src: str, strict: bool):
    """A folder or CSV manifest's splits as sample iterators (each image was decoded once by load_data)."""
    from .bundle import FileImages
    from .datasets import load_data

    bundle = load_data(src, strict=strict, allow_download=False)
    splits = {s: d for s, d in (("train", bundle.train), ("val", bundle.val), ("test", bundle.test)) if d is not None}
    if not all(isinstance(d, FileImages) for d in splits.values()):
        raise DataError(f"{src}: vitkit shards converts image files or a Hugging Face dataset: give a folder of "
                        "class folders, a CSV manifest or a dataset")
    source = Path(bundle.info.get("source") or src).absolute()
    relative_to = source if source.is_dir() else source.parent  # a manifest's paths: from its folder

    def rows(ds):
        for i in range(len(ds)):
            path, label = Path(ds.paths[i]), int(ds.labels[i])
            about = {"label": bundle.class_names[label], "source": os.path.relpath(path, relative_to)}
            yield path.suffix.lower(), path.read_bytes(), label, about

    samples = {split: rows(ds) for split, ds in splits.items()}
    return samples, bundle.class_names, str(source), lambda: bundle.image_size, bundle.info.get("skipped", [])


def _dataset_samples(src: str, strict: bool, options: dict[str, Any]):
    """A Hugging Face dataset's splits as sample iterators, read in order (streamed when asked): each image
    decoded once on the way (unreadable: skipped and counted, or stop with strict); unlabelled rows skipped."""
    from PIL import Image

    from . import hf_datasets
    from .datasets import source_options
    from .images import ImageError

    options = dict(source_options(hf_datasets, src, options))  # the options hf_datasets.load takes
    streaming = hf_datasets.is_on(options.pop("streaming", False))
    st = hf_datasets.stream(src, streaming=streaming, **options)
    skipped: list[dict] = []
    sizes: set = set()
    formats = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif"}

    def rows(role: str):
        for key, cell, value in st.rows(role):
            if value is None or (st.class_names is not None and not 0 <= int(value) < len(st.class_names)):
                skipped.append({"path": key, "reason": f"{src} row {key}: no label"})
                continue
            try:
                img = hf_datasets.decode_cell(cell, 3, f"{src} row {key}")
                data = cell["bytes"] if cell.get("bytes") else Path(cell["path"]).read_bytes()
                kind = Image.open(io.BytesIO(data)).format  # reads the header only
            except (ImageError, OSError) as e:
                if strict:
                    raise DataError(f"{e} (--strict stops at the first unreadable image)") from None
                skipped.append({"path": key, "reason": str(e)})
                continue
            sizes.add(img.size[::-1])  # PIL (W, H) -> (H, W)
            label = int(value) if st.class_names is not None else None
            about = {"label": st.class_names[label] if label is not None else value, "source": key}
            yield formats.get(kind, f".{str(kind).lower()}"), data, label, about

    samples = {role: rows(role) for role in st.roles()}
    return samples, st.class_names, src, lambda: next(iter(sizes)) if len(sizes) == 1 else None, skipped


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mtime, member.mode = len(data), 0, 0o644  # fixed metadata: reproducible shards
    tar.addfile(member, io.BytesIO(data))
