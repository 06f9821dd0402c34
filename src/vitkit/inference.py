"""A trained model (any family, or an ONNX runner) on image files and datasets: top-k predictions, and
evaluation with per-class precision/recall and the confusion matrix. The `predict` and `eval` commands,
and anything that serves a model, call these."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import ConcatDataset, DataLoader

from .data.datasets import Transformed, load_data, map_labels
from .data.images import image_source, load_image
from .data.transforms import conversion_note, eval_transform
from .errors import DataError, ImageError
from .training.evaluate import evaluate, per_class
from .training.models import in_chans


def predict_files(model, paths, top_k: int = 3) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """-> (predictions [{image, top: [{label, index, prob}], source}], errors [{image, error}]); a broken file
    is an error entry, never an exception, so one bad upload does not lose the others. `source` is what the
    file was ({width, height, channels, mode}); `input_note` turns a mismatch into one line."""
    tf = eval_transform(model.preprocess)
    names = model.class_names
    k = min(top_k, model.num_classes)
    preds, errors = [], []
    model.eval()
    for path in paths:
        try:
            image = load_image(path, in_chans(model))
            x = tf(image)[None]  # [1, C, H, W]
        except ImageError as e:
            errors.append({"image": str(path), "error": str(e)})
            continue
        with torch.no_grad():
            probs = model(x).float().softmax(-1)[0]  # [K]
        p, idx = probs.topk(k)
        src = image_source(image)
        preds.append({"image": str(path), "top": [
            {"label": names[i] if names else str(i), "index": int(i), "prob": float(q)} for q, i in zip(p, idx.tolist())],
            "source": None if src is None else dict(zip(("width", "height", "channels", "mode"), src))})
    return preds, errors


def input_note(model, items) -> str | None:
    """One line (or None) saying what the images became when they are far from the model's training data:
    other channels than the model's, or more than 4x its input side (`data.transforms.conversion_note`).
    `items` are `predict_files` predictions or `explain_image` results (dicts with 'image' and 'source')."""
    sources = [(d["image"], None if not d.get("source") else
                (d["source"]["width"], d["source"]["height"], d["source"]["channels"], d["source"]["mode"]))
               for d in items]
    trained_on = (getattr(model, "provenance", None) or {}).get("dataset")
    return conversion_note(model.preprocess, sources, trained_on)


def evaluate_on(model, data: str, *, split: str | None = None, seed: int = 0, val_fraction: float = 0.0,
                batch_size: int = 256, strict: bool = False) -> dict[str, Any]:
    """Top-1/top-5, loss, per-class precision/recall and the confusion matrix of `model` on a split of
    `data` (digits | fashion-mnist | FOLDER | MANIFEST.csv). `split`: test, val, train or all; default test,
    else val, else everything. `seed` and `val_fraction` carve the validation split as training did."""
    ds_all = load_data(data, seed=seed, val_fraction=val_fraction, strict=strict, channels=in_chans(model))
    names = model.class_names or ds_all.class_names
    if model.num_classes != len(names):
        raise DataError(f"the model has {model.num_classes} outputs but {data} has {len(names)} classes")
    map_labels(ds_all, names)
    splits = {"test": ds_all.test, "val": ds_all.val, "train": ds_all.train}
    if split == "all":
        ds = ConcatDataset([s for s in splits.values() if s is not None])
    else:
        split = split or next((k for k in ("test", "val") if splits[k] is not None), "train")
        ds = splits[split]
        if ds is None:
            raise DataError(f"{data} has no {split} split")
    loader = DataLoader(Transformed(ds, eval_transform(model.preprocess), deterministic=False), batch_size=batch_size)
    res = evaluate(model, loader, len(names), torch.device("cpu"))
    return {"data": ds_all.name, "split": split, "count": res["count"], "top1": res["top1"], "top5": res["top5"],
            "loss": res["loss"], "per_class": per_class(res["confusion"], names), "class_names": names,
            "confusion": res["confusion"].tolist(), "skipped_images": ds_all.info.get("num_skipped", 0)}
