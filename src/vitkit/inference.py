"""A trained model (any family, or an ONNX runner) on image files and datasets: top-k predictions, and
evaluation with per-class precision/recall and the confusion matrix. The `predict` and `eval` commands,
and anything that serves a model, call these."""
from __future__ import annotations

import json
import shlex
from typing import Any

import torch

from .data.datasets import data_spec, describe_split, eval_loader, load_data, load_eval_split, shared_images
from .data.images import image_source, load_image
from .data.transforms import conversion_note, eval_transform
from .errors import DataError, ImageError, VitkitError
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
                batch_size: int = 256, strict: bool = False, training: dict[str, Any] | None = None) -> dict[str, Any]:
    """Top-1/top-5, loss, per-class precision/recall and the confusion matrix of `model` on a split of
    `data` (digits | fashion-mnist | FOLDER | MANIFEST.csv). `split`: test, val, train or all; default test,
    else val, else everything (`data.datasets.eval_split`). `seed` and `val_fraction` carve the validation
    split as training did. `training` (a `training_data` result, when `data` is what the model trained on)
    turns on the checks that end up in `warnings`: images of the scored split the run trained on, and data
    that changed since the run recorded its validation split."""
    channels = in_chans(model)
    ds_all, split, ds = load_eval_split(data, channels=channels, class_names=model.class_names, split=split, seed=seed,
                                        val_fraction=val_fraction, strict=strict)
    names = ds_all.class_names  # the model's own, when it has them
    if model.num_classes != len(names):
        raise DataError(f"the model has {model.num_classes} outputs but {data} has {len(names)} classes")
    trained, warnings = (None, []) if training is None else _trained_images(
        ds_all, split, ds, data, seed, val_fraction, training, strict=strict, channels=channels)
    loader = eval_loader(ds, model.preprocess, batch_size=batch_size)
    res = evaluate(model, loader, len(names), torch.device("cpu"))
    return {"data": ds_all.name, "split": split, "count": res["count"], "split_from": describe_split(ds_all, split),
            "trained_images": trained, "warnings": warnings, "top1": res["top1"], "top5": res["top5"],
            "loss": res["loss"], "per_class": per_class(res["confusion"], names), "class_names": names,
            "confusion": res["confusion"].tolist(), "skipped_images": ds_all.info.get("num_skipped", 0)}


def _trained_images(bundle, split: str, scored, data: str, seed: int, val_fraction: float, training: dict[str, Any],
                    *, strict: bool, channels: int) -> tuple[int | None, list[str]]:
    """(how many scored images were in the run's training split or None when unknown, warning lines). The
    training split is this load's own train split when the split was carved as the run did, else a second
    load with the run's seed and fraction (another --seed moves a seeded test or validation split)."""
    if training.get("seed") is None or training.get("val_fraction") is None:
        return None, []
    run_split = (seed, val_fraction or 0.0) == (training["seed"], training["val_fraction"] or 0.0)
    recorded = training.get("val_split") or {}
    carved = (bundle.info.get("split_indices") or {}).get("val_from_train")
    if run_split and carved is not None and recorded.get("indices") is not None \
            and (recorded.get("seed"), recorded.get("fraction")) == (seed, val_fraction) \
            and list(recorded["indices"]) != list(carved):
        return None, [f"{data} changed since the run: its validation split is not the one the run recorded "
                      f"({training.get('from')}), so some of these {len(scored)} images may have been trained on"]
    train = bundle.train if run_split else load_data(data, seed=training["seed"], val_fraction=training["val_fraction"],
                                                     strict=strict, channels=channels).train
    n = shared_images(scored, train)
    if not n:
        return 0, []
    return n, [f"{n} of the {len(scored)} images scored ({split} split) were in the run's training split, so the "
               "model trained on them and these scores overstate its accuracy on new images (the held-out split: "
               "no --split, no --seed)"]


def training_data(checkpoint: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """What the checkpoint was trained on and how it was split: {data, seed, val_fraction, val_split, from},
    each None when unknown; `data` is a spec load_data reads. In order: the checkpoint's provenance (`dataset`,
    `seed`, `val_fraction`), the run folder's config.json beside the file, then the recipe and the reproducing
    command the provenance records. `val_split` is the carved validation split config.json records, {seed,
    fraction, indices} (indices into the train split before carving), which `evaluate_on` checks its carve
    against."""
    out: dict[str, Any] = {"data": provenance.get("dataset"), "seed": provenance.get("seed"),
                           "val_fraction": provenance.get("val_fraction"), "val_split": None,
                           "from": "checkpoint provenance"}
    config, saved = _run_config(checkpoint)
    data_info = saved.get("data") if isinstance(saved.get("data"), dict) else {}
    carved = data_info.get("val_split")  # what the run actually carved
    indices = (data_info.get("split_indices") or {}).get("val_from_train")
    if isinstance(carved, dict) and isinstance(indices, list):
        out["val_split"] = {"seed": carved.get("seed"), "fraction": carved.get("fraction"), "indices": indices}
    if out["seed"] is None or out["val_fraction"] is None:
        recipe = dict(saved["recipe"]) if isinstance(saved.get("recipe"), dict) else None
        if recipe is not None:
            out["from"] = str(config)
            if isinstance(carved, dict):
                recipe |= {"val_fraction": carved.get("fraction"), "seed": carved.get("seed", recipe.get("seed"))}
        elif provenance.get("recipe"):
            recipe = _recipe_from_command(provenance["recipe"], provenance.get("command", ""))
            out["from"] = "the recipe and command in the checkpoint's provenance"
        if recipe:
            out["data"] = recipe.get("data") or out["data"]  # the spec as given (a folder path, not its label)
            out["seed"] = out["seed"] if out["seed"] is not None else recipe.get("seed")
            if out["val_fraction"] is None:
                out["val_fraction"] = recipe.get("val_fraction")
    out["data"] = data_spec(out["data"])
    return out


def _run_config(checkpoint: str) -> tuple[str | None, dict[str, Any]]:
    """(path, contents) of the config.json of the run folder holding `checkpoint`; (None, {}) when there is none
    or it cannot be read (a checkpoint on its own still evaluates, from its provenance)."""
    from .weights.io import resolve_path

    try:
        config = resolve_path(checkpoint).parent / "config.json"
        saved = json.loads(config.read_text()) if config.is_file() else None
    except (OSError, ValueError, TypeError, VitkitError):
        return None, {}
    return (str(config), saved) if isinstance(saved, dict) else (None, {})


def _recipe_from_command(name: str, command: str) -> dict[str, Any] | None:
    """The recipe a run used: the preset it names plus the `--set key=value` (and --seed/--data) of the command
    the trainer records, which reproduces the run (see cli.train.canonical_command)."""
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
