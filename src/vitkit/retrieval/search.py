"""Queries against a saved index: images (embedded with the index's own model, checked by identity) or text
(a CLIP model's text tower), top-k hits with their original paths, and a contact sheet of the hits."""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._files import atomic_path
from ..data.images import load_image
from ..data.transforms import eval_transform
from ..errors import ConfigError, DataError, ImageError
from .embed import features_of, model_identity
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
    f = features_of(model, torch.stack(xs), feature, normalize)  # [n, D]
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
    return [{"path": h.path, "score": h.score, "label": h.label, "row": h.row} for h in hits]


# ---------------------------------------------------------------------------- contact sheet
@functools.lru_cache(maxsize=4)
def _dataset_source(name: str, split: str):
    from .sources import open_source

    return open_source(name, split)


def load_item(path: str, channels: int = 3):
    """A hit's image as a PIL image: the file, or the item of a built-in dataset (`NAME:SPLIT/INDEX`)."""
    from PIL import Image

    if not os.path.exists(path) and ":" in path and "/" in path.rsplit(":", 1)[1]:
        name, rest = path.rsplit(":", 1)
        split, i = rest.split("/")
        x, _ = _dataset_source(name, split).datasets[split][int(i)]  # uint8 [C, H, W]
        arr = x.numpy()  # [C, H, W] uint8
        return Image.fromarray(arr[0] if arr.shape[0] == 1 else arr.transpose(1, 2, 0))
    return load_image(path, channels)


def contact_sheet(queries: list[tuple[str, Any]], results: list[list[Hit]], out: str | os.PathLike,
                  thumb: int = 112) -> Path:
    """One row per query: the query (an image path, or text) then its hits, each captioned with rank and score."""
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
        for c, h in enumerate(hits, start=1):
            paste(_safe(load_item, h.path), c, r, f"{c}: {h.score:.3f}")
    out = Path(out)
    with atomic_path(out) as tmp:
        sheet.save(tmp, format="PNG")
    return out


def _safe(fn, *args):
    try:
        return fn(*args)
    except (ImageError, DataError, OSError, ValueError):
        return None  # a moved or deleted file: an empty cell, the caption still says what it was
