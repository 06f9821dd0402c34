"""Queries against a saved index: images (embedded with the index's own model, checked by identity) or text
(a CLIP model's text tower), top-k hits with their original paths, and a contact sheet of the hits."""
from __future__ import annotations

import functools
import json
import os
from collections import deque
from collections.abc import Sequence
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._files import atomic_path
from ..data.images import load_image
from ..data.transforms import eval_transform, stack_inputs
from ..errors import ConfigError, DataError, ImageError
from .embed import Embeddings, features_of, model_identity
from .index import Hit, SearchIndex


def load_index_model(index: SearchIndex, checkpoint: str | None = None) -> nn.Module:
    """The model that made the index's features (its recorded checkpoint, or `checkpoint`), checked by identity."""
    from ..api import load_model

    ident = index.model_identity
    source = checkpoint or ident.get("checkpoint")
    if not source:
        raise ConfigError(f"{index.path} records no checkpoint for its model; pass --model CKPT")
    model = load_model(source)
    model.eval()
    index.check_identity(model_identity(model, source, ident["feature"], ident["normalized"]))
    return model


def embed_images(model: nn.Module, paths: list[str], feature: str = "pooled",
                 normalize: bool = True) -> tuple[np.ndarray, list[str], list[dict[str, str]]]:
    """(features [n, D] float32 of the readable images, their paths, [{image, error}] for the others)."""
    tf = eval_transform(model.preprocess)
    channels = int(model.preprocess.input_size[0])
    xs, ok, errors = [], [], []
    for p in paths:
        try:
            xs.append(tf(load_image(p, channels)))
            ok.append(str(p))
        except ImageError as e:
            errors.append({"image": str(p), "error": str(e)})
    if not xs:
        return np.zeros((0, 0), np.float32), ok, errors
    f = features_of(model, stack_inputs(xs), feature, normalize)  # [n, D]
    return f.numpy().astype(np.float32), ok, errors


def embed_texts(model: nn.Module, texts: list[str], feature: str = "pooled") -> np.ndarray:
    """CLIP text features [n, D] (L2-normalised) in the image embedding space; a model without a text tower is
    refused in one line."""
    if not hasattr(model, "encode_text"):
        raise ConfigError(f"--text needs a CLIP model with a text tower; the index was built with a "
                          f"{getattr(model, 'family', type(model).__name__)} model that has none")
    if feature != "pooled":
        raise ConfigError(f"--text compares with pooled CLIP image embeddings; this index holds {feature} features")
    try:
        from ..zeroshot import text_features
    except ImportError:
        raise ConfigError("--text needs vitkit.zeroshot (the CLIP text tower), which this vitkit does not have") from None
    with torch.no_grad():
        return text_features(model, texts).float().cpu().numpy()


def hits_json(hits: list[Hit]) -> list[dict[str, Any]]:
    return [{"path": h.path, "score": h.score, "label": h.label, "row": h.row}
            | ({"index": h.index} if h.index is not None else {}) for h in hits]


# ---------------------------------------------------------------------------- queries from the collection
def item_key(row: dict) -> tuple:
    """What identifies an embedded item in a manifest: its original path (or `NAME:SPLIT/INDEX`) and the size
    recorded for it, so a file replaced since by another image is not taken for the same item."""
    return (row["path"], row.get("bytes"), row.get("width"), row.get("height"))


def _same_vectors(a: np.ndarray, b: np.ndarray, batch: int = 65536) -> bool:
    if a.shape != b.shape:
        return False
    return all(np.array_equal(a[i:i + batch], b[i:i + batch]) for i in range(0, len(a), batch))  # memory maps


def own_entries(queries: Embeddings, gallery: Embeddings) -> tuple[bool, np.ndarray]:
    """(whether the queries ARE the gallery collection, [M] the gallery row of each query's own item or -1).

    The same collection: the same folder, the same manifest (item keys in the same order) or the same vectors
    (a copy moved elsewhere). Otherwise each query is matched to a gallery item with its key; an item listed
    k times on both sides pairs its k-th query with its k-th gallery row, as leave-one-out would."""
    n = len(queries.rows)
    if (queries.path.resolve() == gallery.path.resolve()
            or [item_key(r) for r in queries.rows] == [item_key(r) for r in gallery.rows]
            or _same_vectors(queries.vectors, gallery.vectors)):
        return True, np.arange(n)
    rows_of: dict[tuple, deque[int]] = {}
    for j, r in enumerate(gallery.rows):
        rows_of.setdefault(item_key(r), deque()).append(j)
    own = np.full(n, -1, dtype=np.int64)
    for i, r in enumerate(queries.rows):
        left = rows_of.get(item_key(r))
        if left:
            own[i] = left.popleft()
    return False, own


# ---------------------------------------------------------------------------- score labels
# A float32 cosine of unit vectors is only good to about 1e-6: a self match comes back as 0.99999994 or 1.0000001.
COSINE_RESOLUTION = 1e-6
MAX_SCORE_DECIMALS = 6  # scores further apart than COSINE_RESOLUTION always read differently at 6 decimals


def _floored(score: float, decimals: int) -> str:
    if score >= 1 - COSINE_RESOLUTION:  # float32 noise around an exact match
        score = 1.0
    step = Decimal(1).scaleb(-decimals)
    # from the shortest repr, so 0.942 floors to 0.942, not to 0.941 as 0.942 * 1000 = 941.999... would
    return str(Decimal(repr(float(score))).quantize(step, rounding=ROUND_FLOOR))


def score_labels(scores: Sequence[float], min_decimals: int = 3) -> list[str]:
    """Cosine scores as text, floored (never rounded up: 0.9998 reads 0.999, never 1.000, so only an exact match
    reads as 1) with one number of decimals for all: the fewest, at least `min_decimals`, at which scores more
    than COSINE_RESOLUTION apart read differently."""
    scores = [float(s) for s in scores]
    for decimals in range(min_decimals, MAX_SCORE_DECIMALS + 1):
        labels = [_floored(s, decimals) for s in scores]
        spans: dict[str, list[float]] = {}
        for label, s in zip(labels, scores):
            spans.setdefault(label, []).append(s)
        if all(max(v) - min(v) <= COSINE_RESOLUTION for v in spans.values()):
            break
    return labels


def hit_captions(hits: list[Hit]) -> list[str]:
    """'rank: score' under each hit of one query's row on the contact sheet."""
    return [f"{rank}: {label}" for rank, label in enumerate(score_labels([h.score for h in hits]), start=1)]


# ---------------------------------------------------------------------------- contact sheet
@functools.lru_cache(maxsize=8)
def _opened(spec: str, split: str, options: str):
    """(the Source, its item number by reference), opened once per sheet source (`options`: sorted JSON)."""
    from .sources import open_source

    source = open_source(spec, split, json.loads(options) or None)
    return source, {ref: i for i, ref in enumerate(source.refs)}


def _pil(x):
    from PIL import Image

    if isinstance(x, Image.Image):
        return x
    arr = x.numpy()  # uint8 [C, H, W]
    return Image.fromarray(arr[0] if arr.shape[0] == 1 else arr.transpose(1, 2, 0))


def load_item(path: str, channels: int = 3, sources: list[dict] | None = None):
    """A hit's image as a PIL image: the file; the item of a built-in dataset (`NAME:SPLIT/INDEX`); else the
    sample of that reference (a shard key such as `train/000001`) in one of `sources`, the data the index was
    embedded from ([{spec, split, options}], `index.image_sources`)."""
    if os.path.exists(path):
        return load_image(path, channels)
    if ":" in path and "/" in path.rsplit(":", 1)[1]:
        name, rest = path.rsplit(":", 1)
        split, i = rest.split("/")
        if i.isdigit():
            source, _ = _opened(name, split, "{}")
            return _pil(source.datasets[split][int(i)][0])
    for s in sources or []:
        source, by_ref = _opened(s["spec"], s.get("split", "all"), json.dumps(s.get("options") or {}, sort_keys=True))
        if path in by_ref:
            return _pil(source.load(by_ref[path], channels)[0])
    return load_image(path, channels)  # a moved or deleted file: its own one-line error


def contact_sheet(queries: list[tuple[str, Any]], results: list[list[Hit]], out: str | os.PathLike,
                  thumb: int = 112, sources: list[dict] | None = None) -> Path:
    """One row per query: the query (an image path, or text) then its hits, each captioned with rank and score.
    `sources`: the data the index was embedded from, where hits that are not files are read back (`load_item`)."""
    from PIL import Image, ImageDraw

    cols = 1 + max((len(r) for r in results), default=0)
    cap = 14
    sheet = Image.new("RGB", (cols * (thumb + 4) + 4, len(results) * (thumb + cap + 6) + 4), "white")
    draw = ImageDraw.Draw(sheet)

    def paste(img, col: int, row: int, caption: str) -> None:
        x, y = 4 + col * (thumb + 4), 4 + row * (thumb + cap + 6)
        if img is not None:
            img = img.convert("RGB")
            img.thumbnail((thumb, thumb))
            sheet.paste(img, (x + (thumb - img.width) // 2, y + (thumb - img.height) // 2))
        draw.text((x, y + thumb + 2), caption[: thumb // 6], fill="black")

    for r, ((kind, q), hits) in enumerate(zip(queries, results)):
        if kind == "image":
            paste(_safe(load_item, q), 0, r, "query")
        else:
            draw.text((8, 4 + r * (thumb + cap + 6) + thumb // 2), f'"{q}"'[: thumb // 6], fill="black")
        for c, (h, caption) in enumerate(zip(hits, hit_captions(hits)), start=1):
            paste(_safe(load_item, h.path, 3, sources), c, r, caption)
    out = Path(out)
    with atomic_path(out) as tmp:
        sheet.save(tmp, format="PNG")
    return out


def _safe(fn, *args):
    try:
        return fn(*args)
    except (ImageError, DataError, OSError, ValueError):
        return None  # a moved or deleted file: an empty cell, the caption still says what it was
