"""`vitkit embed`: frozen features of a whole collection, written so that a killed run resumes exactly.

Layout of EMB_DIR when finished:
- `embeddings.npy`  [N, D] (or [N, T, D] patch tokens) float32/float16, `np.load(..., mmap_mode="r")`-able;
- `manifest.jsonl`  one line per row: {row, path, label, bytes, width, height} (`path` is the original file, or
  `NAME:SPLIT/INDEX` for a built-in dataset);
- `meta.json`       the model identity, feature kind, dtype, counts and the skipped (unreadable) images.
  It is written last: its presence means the embeddings are complete.

While running, `parts/` holds the plan (`plan.json`: source digest, model identity, settings) and one pair of
files per chunk of `chunk_size` items: the features (`NNNNNN.npy`) first, then the chunk's record
(`NNNNNN.json`, rows and skipped images). Both are written atomically and a chunk counts as done only when its
record exists, so a kill at any moment loses at most the chunk in flight, and a resumed run redoes exactly the
chunks without a record: no row is lost or written twice. Under torchrun every rank takes the chunks
`i % WORLD_SIZE == RANK` into the same `parts/`, and rank 0 merges once all records exist (or `merge()` later).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .._files import atomic_path, atomic_write_text
from ..data.transforms import blank_input, collate, eval_transform
from ..errors import ConfigError, DataError, ImageError
from ..models.features import pooled_features
from ..models.protocol import require
from .sources import Source, open_source

log = logging.getLogger("vitkit")

FEATURES = ("pooled", "cls", "patch")
DTYPES = {"float32": np.float32, "float16": np.float16}
EMBEDDINGS, MANIFEST, META, PARTS = "embeddings.npy", "manifest.jsonl", "meta.json", "parts"


# ---------------------------------------------------------------------------- model side
def weights_sha256(model: nn.Module) -> str:
    """sha256 of the model's state dict (names, dtypes, shapes, bytes): the same weights from any file agree."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    return h.hexdigest()


def model_identity(model: nn.Module, checkpoint: str | None, feature: str = "pooled", normalize: bool = True) -> dict:
    """What makes two sets of features comparable: the same weights, preprocessing, feature kind and normalisation.
    `checkpoint` is where the model came from (to embed queries with it later)."""
    prov = getattr(model, "provenance", {}) or {}
    if checkpoint is not None and Path(checkpoint).exists():  # a file: findable from any working directory
        checkpoint = str(Path(checkpoint).resolve())
    return {"checkpoint": None if checkpoint is None else str(checkpoint), "weights_sha256": weights_sha256(model),
            "family": getattr(model, "family", type(model).__name__), "arch": prov.get("arch"),
            "preprocess": model.preprocess.to_dict(), "feature": feature, "normalized": bool(normalize)}


IDENTITY_KEYS = ("weights_sha256", "preprocess", "feature", "normalized")


def same_model(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in IDENTITY_KEYS)


def check_feature(model: nn.Module, feature: str) -> None:
    if feature not in FEATURES:
        raise ConfigError(f"feature must be one of {', '.join(FEATURES)}, got {feature!r}")
    if feature == "cls" and getattr(getattr(model, "visual", model), "cls_token", None) is None:
        raise ConfigError(f"--feature cls needs a class token; this {getattr(model, 'family', 'model')} model has none "
                          "(use pooled)")
    if feature == "patch":  # the feature contract (models/features.py) gives every family's maps
        require(model, "intermediates", "--feature patch")


@torch.no_grad()
def features_of(model: nn.Module, x: torch.Tensor, feature: str = "pooled", normalize: bool = True) -> torch.Tensor:
    """Images [B, C, H, W] -> pooled / class-token features [B, D] or patch tokens [B, N, D] (L2-normalised over D).

    Patch tokens are the last map of the feature contract with the final norm (a ViT's normed patch tokens, a
    Swin's normed last stage, a ResNet's layer4), one per position in row-major order."""
    if feature == "pooled":  # before the classifier; a CLIP model's is its projected image embedding (encode_image)
        f = pooled_features(model, x)  # [B, D]
    elif feature == "patch":
        last = model.forward_intermediates(x, indices=1, norm=True, intermediates_only=True)[0]  # [B, F, h, w]
        f = last.flatten(2).transpose(1, 2)  # [B, h*w, F]
    else:
        tower = getattr(model, "visual", model)  # CLIP keeps its ViT as .visual
        f = tower.forward_features(x)[:, 0]  # the class token [B, D] after the final norm
    f = f.float()
    return F.normalize(f, dim=-1) if normalize else f


# ---------------------------------------------------------------------------- data side
class _Items(Dataset):
    """Item i -> (image tensor, i, ok, info JSON). A broken image gives zeros and ok=False (never an exception:
    one bad file must not stop a million-image run)."""

    def __init__(self, source: Source, pre):
        self.source, self.transform, self.channels = source, eval_transform(pre), int(pre.input_size[0])
        self.pre = pre

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        try:
            img, info = self.source.load(i, self.channels)
            return self.transform(img), i, True, json.dumps(info)
        except ImageError as e:
            return blank_input(self.pre), i, False, json.dumps({"reason": str(e)})
        except (OSError, ValueError, RuntimeError) as e:  # a decodable file the transform still chokes on
            return blank_input(self.pre), i, False, json.dumps({"reason": f"{self.source.refs[i]}: {e}"})


def _chunk_name(i: int) -> str:
    return f"{i:06d}"


def _plan(source: Source, identity: dict, dtype: str, chunk_size: int, split: str,
          options: dict[str, Any] | None = None) -> dict:
    return {"source": source.spec, "split": split, "options": dict(options or {}), "kind": source.kind,
            "count": len(source),
            "items_sha256": source.digest(), "model": identity, "dtype": dtype, "chunk_size": chunk_size}


def _same_plan(a: dict, b: dict) -> bool:
    keys = ("source", "split", "count", "items_sha256", "dtype", "chunk_size")
    return all(a.get(k) == b.get(k) for k in keys) and same_model(a["model"], b["model"])


def _progress(enabled: bool, total: int, done: int):
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("[bold]embed"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TimeRemainingColumn(), transient=False)
    bar.start()
    bar.add_task("embed", total=total, completed=done, rate="")
    return bar


def embed(model: nn.Module, src: str | Source, out: str | os.PathLike, *, checkpoint: str | None = None,
          split: str = "all", feature: str = "pooled", normalize: bool = True, dtype: str = "float32",
          batch_size: int = 64, workers: int = 0, chunk_size: int = 1024, progress: bool = False,
          overwrite: bool = False, rank: int | None = None, world_size: int | None = None,
          merge_timeout: float = 3600.0, on_chunk: Callable[[int], None] | None = None,
          options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Embed every image of `src` into `out` (see the module docstring), resuming an unfinished run of the same
    plan. Returns the merged summary (meta.json) on rank 0, or this rank's part summary on the others."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if chunk_size < 1 or batch_size < 1:
        raise ConfigError("chunk_size and batch_size must be at least 1")
    check_feature(model, feature)
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    out = Path(out)
    source = src if isinstance(src, Source) else open_source(src, split, options)
    if (out / META).exists():
        if not overwrite:
            raise DataError(f"{out} already holds finished embeddings; pass --overwrite to redo them, or another --out")
        if rank == 0:
            clear(out)
    identity = model_identity(model, checkpoint, feature, normalize)
    plan = _plan(source, identity, dtype, chunk_size, split, options)
    parts = out / PARTS
    saved = parts / "plan.json"
    if saved.exists():
        old = json.loads(saved.read_text())
        if not _same_plan(old, plan):
            if not overwrite:
                raise DataError(f"{out} holds an unfinished run with another source, model or settings; resume it with "
                                "the same arguments, or pass --overwrite to start again")
            if rank == 0:
                clear(out)
    parts.mkdir(parents=True, exist_ok=True)
    if not saved.exists() or rank == 0:
        atomic_write_text(saved, json.dumps(plan, indent=1))

    n_chunks = -(-len(source) // chunk_size)
    mine = [c for c in range(n_chunks) if c % world_size == rank]
    todo = [c for c in mine if not (parts / f"{_chunk_name(c)}.json").exists()]
    done_items = sum(min(chunk_size, len(source) - c * chunk_size) for c in mine if c not in todo)
    if todo:
        _run_chunks(model, source, parts, todo, chunk_size, feature, normalize, DTYPES[dtype], batch_size, workers,
                    _progress(progress, sum(min(chunk_size, len(source) - c * chunk_size) for c in mine), done_items),
                    on_chunk)
    if rank != 0:
        return {"rank": rank, "chunks": len(mine), "embedded_now": len(todo)}
    _wait_for_parts(parts, n_chunks, merge_timeout)
    return merge(out)


def _run_chunks(model, source: Source, parts: Path, todo: list[int], chunk_size: int, feature: str,
                normalize: bool, np_dtype, batch_size: int, workers: int, bar, on_chunk) -> None:
    items = _Items(source, model.preprocess)
    n = len(source)
    batches, owner = [], []  # batches never cross a chunk boundary: a finished chunk is written at once
    for c in todo:
        idx = list(range(c * chunk_size, min((c + 1) * chunk_size, n)))
        for b in range(0, len(idx), batch_size):
            batches.append(idx[b:b + batch_size])
            owner.append(c)
    left = {c: sum(1 for o in owner if o == c) for c in todo}
    loader = DataLoader(items, batch_sampler=batches, num_workers=workers, persistent_workers=False, collate_fn=collate)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    feats: list[np.ndarray] = []
    rows: list[dict] = []
    skipped: list[dict] = []
    t0, seen = time.perf_counter(), 0
    try:
        for c, (x, index, ok, info) in zip(owner, loader):
            ok = ok.bool()
            if ok.any():
                f = features_of(model, x[ok].to(device), feature, normalize)
                feats.append(f.cpu().numpy().astype(np_dtype))
            for i, good, meta in zip(index.tolist(), ok.tolist(), info):
                meta = json.loads(meta)
                if good:
                    rows.append({"item": i, "path": source.refs[i], "label": source.labels[i]} | meta)
                else:
                    skipped.append({"item": i, "path": source.refs[i], "reason": meta["reason"]})
            left[c] -= 1
            seen += len(index)
            if bar is not None:
                bar.update(bar.task_ids[0], advance=len(index), rate=f"{seen / (time.perf_counter() - t0):.0f} img/s")
            if left[c] == 0:
                _write_chunk(parts, c, feats, rows, skipped, np_dtype)
                feats, rows, skipped = [], [], []
                if on_chunk is not None:
                    on_chunk(c)
    finally:
        model.train(was)
        if bar is not None:
            bar.stop()


def _write_chunk(parts: Path, c: int, feats: list[np.ndarray], rows: list[dict], skipped: list[dict],
                 np_dtype) -> None:
    """The features first, then the record that marks the chunk done (each atomically)."""
    arr = np.concatenate(feats) if feats else np.zeros((0,), np_dtype)
    with atomic_path(parts / f"{_chunk_name(c)}.npy") as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)
    record = {"chunk": c, "rows": rows, "skipped": skipped, "shape": list(arr.shape)}
    atomic_write_text(parts / f"{_chunk_name(c)}.json", json.dumps(record))


def _wait_for_parts(parts: Path, n_chunks: int, timeout: float) -> None:
    """Rank 0 waits for the other ranks' chunk records (a shared folder: no process group needed)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [c for c in range(n_chunks) if not (parts / f"{_chunk_name(c)}.json").exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise DataError(f"{parts}: {len(missing)} chunk(s) still missing after {timeout:.0f} s (another rank "
                            "stopped?); rerun the same command to finish them, then `vitkit embed --merge`")
        time.sleep(0.5)


def merge(out: str | os.PathLike, keep_parts: bool = False) -> dict[str, Any]:
    """Join the chunk parts of `out` into embeddings.npy + manifest.jsonl + meta.json (in item order)."""
    out = Path(out)
    parts = out / PARTS
    if (out / META).exists() and not parts.exists():
        return json.loads((out / META).read_text())
    if not (parts / "plan.json").exists():
        raise DataError(f"{out}: no embedding run to merge (no {PARTS}/plan.json)")
    plan = json.loads((parts / "plan.json").read_text())
    n_chunks = -(-plan["count"] // plan["chunk_size"])
    missing = [c for c in range(n_chunks) if not (parts / f"{_chunk_name(c)}.json").exists()]
    if missing:
        raise DataError(f"{out}: {len(missing)} of {n_chunks} chunk(s) are not embedded yet (first: {missing[0]}); "
                        "rerun the embed command to finish them")
    records = [json.loads((parts / f"{_chunk_name(c)}.json").read_text()) for c in range(n_chunks)]
    arrays = [np.load(parts / f"{_chunk_name(c)}.npy", mmap_mode="r") for c in range(n_chunks)]
    for rec, arr in zip(records, arrays):
        if len(rec["rows"]) and (list(arr.shape) != rec["shape"] or len(arr) != len(rec["rows"])):
            raise DataError(f"{parts}: chunk {rec['chunk']} has {len(arr)} feature rows for {len(rec['rows'])} "
                            "images (a damaged part): delete its .json to redo it")
    shapes = [a.shape[1:] for a, r in zip(arrays, records) if r["rows"]]
    if not shapes:
        raise DataError(f"{out}: none of the {plan['count']} images could be read")
    total = sum(len(r["rows"]) for r in records)
    np_dtype = DTYPES[plan["dtype"]]
    with atomic_path(out / EMBEDDINGS) as tmp:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np_dtype, shape=(total, *shapes[0]))
        row = 0
        for rec, arr in zip(records, arrays):
            mm[row:row + len(rec["rows"])] = arr[:len(rec["rows"])]
            row += len(rec["rows"])
        mm.flush()
        del mm
    lines, skipped, row = [], [], 0
    for rec in records:
        for r in rec["rows"]:
            lines.append(json.dumps({"row": row} | {k: v for k, v in r.items() if k != "item"}))
            row += 1
        skipped += rec["skipped"]
    atomic_write_text(out / MANIFEST, "\n".join(lines) + "\n")
    labels = sorted({json.loads(line)["label"] for line in lines} - {None})
    meta = {"count": total, "dim": int(shapes[0][-1]), "shape": [total, *map(int, shapes[0])], "dtype": plan["dtype"],
            "source": plan["source"], "split": plan["split"], "source_options": plan.get("options", {}),
            "source_kind": plan["kind"], "items": plan["count"],
            "items_sha256": plan["items_sha256"], "model": plan["model"], "labels": labels,
            "num_skipped": len(skipped), "skipped": skipped}
    atomic_write_text(out / META, json.dumps(meta, indent=1))
    if not keep_parts:
        shutil.rmtree(parts, ignore_errors=True)
    return meta


def clear(out: Path) -> None:
    """Remove what an embedding run writes (and nothing else) from `out`."""
    for name in (META, EMBEDDINGS, MANIFEST):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / PARTS, ignore_errors=True)


class Embeddings:
    """A finished EMB_DIR: `.vectors` (memory-mapped [N, D]), `.rows` (manifest dicts), `.meta`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not (self.path / META).exists():
            if (self.path / PARTS / "plan.json").exists():
                raise DataError(f"{path}: the embedding run is not finished (rerun `vitkit embed` with the same "
                                "arguments to resume it)")
            raise DataError(f"{path}: not an embeddings folder from `vitkit embed` (no {META})")
        self.meta = json.loads((self.path / META).read_text())
        self.vectors = np.load(self.path / EMBEDDINGS, mmap_mode="r")
        self._rows: list[dict] | None = None

    @property
    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = [json.loads(line) for line in (self.path / MANIFEST).read_text().splitlines() if line]
        return self._rows

    @property
    def model_identity(self) -> dict:
        return self.meta["model"]

    def __len__(self) -> int:
        return int(self.meta["count"])

    def labels(self) -> list[str | None]:
        return [r.get("label") for r in self.rows]
