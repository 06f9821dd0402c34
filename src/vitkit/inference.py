"""A trained model (any family, or an ONNX runner) on image files and datasets: top-k predictions, and
evaluation with per-class precision/recall and the confusion matrix. The `predict` and `eval` commands,
and anything that serves a model, call these."""
from __future__ import annotations

import json
import shlex
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
        preds.append({"image": str(path), "top": top_entries(probs, names, k), "source": source_of(image)})
    return preds, errors


def top_entries(probs: torch.Tensor, class_names, k: int) -> list[dict[str, Any]]:
    """Class probabilities [K] -> the k most likely as [{label, index, prob}] (label: the index without names)."""
    p, idx = probs.topk(min(k, int(probs.numel())))
    return [{"label": class_names[i] if class_names else str(i), "index": int(i), "prob": float(q)}
            for q, i in zip(p, idx.tolist())]


def source_of(image) -> dict[str, Any] | None:
    """What a `load_image` / `decode_image` result was before conversion: {width, height, channels, mode}."""
    src = image_source(image)
    return None if src is None else dict(zip(("width", "height", "channels", "mode"), src))


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


def training_data(checkpoint: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """What the checkpoint was trained on and how it was split: {data, seed, val_fraction, from}, each None when
    unknown. In order: the checkpoint's provenance (`dataset`, `seed`, `val_fraction`), the run folder's
    config.json beside the file, then the recipe and the reproducing command the provenance records."""
    out: dict[str, Any] = {"data": provenance.get("dataset"), "seed": provenance.get("seed"),
                           "val_fraction": provenance.get("val_fraction"), "from": "checkpoint provenance"}
    if out["seed"] is not None and out["val_fraction"] is not None:
        return out
    recipe = None
    try:
        from .weights.io import resolve_path

        config = resolve_path(checkpoint).parent / "config.json"
        saved = json.loads(config.read_text()) if config.is_file() else {}
        recipe = dict(saved["recipe"]) if saved else None
        if recipe is not None:
            out["from"] = str(config)
            carved = (saved.get("data") or {}).get("val_split")  # what the run actually carved
            if isinstance(carved, dict):
                recipe |= {"val_fraction": carved.get("fraction"), "seed": carved.get("seed", recipe.get("seed"))}
    except (OSError, ValueError, KeyError, TypeError):
        recipe = None
    if recipe is None and provenance.get("recipe"):
        recipe = _recipe_from_command(provenance["recipe"], provenance.get("command", ""))
        out["from"] = "the recipe and command in the checkpoint's provenance"
    if recipe:
        out["data"] = recipe.get("data") or out["data"]  # the spec as given (a folder path, not its label)
        out["seed"] = out["seed"] if out["seed"] is not None else recipe.get("seed")
        if out["val_fraction"] is None:
            out["val_fraction"] = recipe.get("val_fraction")
    for prefix in ("folder:", "csv:"):  # a dataset's label (DataBundle.name) -> the spec load_data reads
        if isinstance(out["data"], str) and out["data"].startswith(prefix):
            out["data"] = out["data"][len(prefix):]
    return out


def _recipe_from_command(name: str, command: str) -> dict[str, Any] | None:
    """The recipe a run used: the preset it names plus the `--set key=value` (and --seed/--data) of the command
    the trainer records, which reproduces the run (see cli.train.canonical_command)."""
    from .errors import VitkitError
    from .training.recipes import get_recipe

    try:
        recipe = get_recipe(name)
        argv = shlex.split(command or "")
        sets = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]
        sets += [f"{flag[2:]}={argv[i + 1]}" for i, flag in enumerate(argv[:-1]) if flag in ("--seed", "--data")]
        keep = [s for s in sets if s.split("=", 1)[0] in ("seed", "val_fraction", "data")]
        return recipe.override(keep).to_dict()
    except (VitkitError, ValueError):
        return None
