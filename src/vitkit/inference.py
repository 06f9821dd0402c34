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
from .data.transforms import conversion_note, eval_transform, stack_inputs
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
            x = stack_inputs([tf(image)])  # [1, C, H, W] (a PatchBatch with max_tokens)
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
                batch_size: int = 256, strict: bool = False, training: dict[str, Any] | None = None,
                options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Top-1/top-5, loss, per-class precision/recall and the confusion matrix of `model` on a split of
    `data` (digits | fashion-mnist | FOLDER | MANIFEST.csv). `split`: test, val, train or all; default test,
    else val, else everything (`data.datasets.eval_split`). `seed` and `val_fraction` carve the validation
    split as training did. `training` (a `training_data` result, when `data` is what the model trained on)
    turns on the checks that end up in `warnings`: images of the scored split the run trained on, and data
    that changed since the run recorded its validation split. `options`: the data source's own settings
    (`data.label_key=...`, as `load_data` takes them)."""
    channels = in_chans(model)
    ds_all, split, ds = load_eval_split(data, channels=channels, class_names=model.class_names, split=split, seed=seed,
                                        val_fraction=val_fraction, strict=strict, options=options)
    names = ds_all.class_names  # the model's own, when it has them
    if model.num_classes != len(names):
        raise DataError(f"the model has {model.num_classes} outputs but {data} has {len(names)} classes")
    trained, warnings = (None, []) if training is None else _trained_images(
        ds_all, split, ds, data, seed, val_fraction, training, strict=strict, channels=channels, options=options)
    loader = eval_loader(ds, model.preprocess, batch_size=batch_size)
    res = evaluate(model, loader, len(names), torch.device("cpu"))
    return {"data": ds_all.name, "split": split, "count": res["count"], "split_from": describe_split(ds_all, split),
            "trained_images": trained, "warnings": warnings, "top1": res["top1"], "top5": res["top5"],
            "loss": res["loss"], "per_class": per_class(res["confusion"], names), "class_names": names,
            "confusion": res["confusion"].tolist(), "skipped_images": ds_all.info.get("num_skipped", 0)}


def _trained_images(bundle, split: str, scored, data: str, seed: int, val_fraction: float, training: dict[str, Any],
                    *, strict: bool, channels: int, options: dict[str, Any] | None = None) -> tuple[int | None, list[str]]:
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
                                                     strict=strict, channels=channels, options=options).train
    n = shared_images(scored, train)
    if not n:
        return 0, []
    return n, [f"{n} of the {len(scored)} images scored ({split} split) were in the run's training split, so the "
               "model trained on them and these scores overstate its accuracy on new images (the held-out split: "
               "no --split, no --seed)"]


def training_data(checkpoint: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """What the checkpoint was trained on and how it was split: {data, seed, val_fraction, val_split, options,
    from}, each None when unknown; `data` is a spec load_data reads, `options` the data source's settings the run
    used (its recipe's `data_args`: `--set data.label_key=...`), so the same data is read the same way again. In order: the checkpoint's provenance (`dataset`,
    `seed`, `val_fraction`), the run folder's config.json beside the file, then the recipe and the reproducing
    command the provenance records. `val_split` is the carved validation split config.json records, {seed,
    fraction, indices} (indices into the train split before carving), which `evaluate_on` checks its carve
    against."""
    out: dict[str, Any] = {"data": provenance.get("dataset"), "seed": provenance.get("seed"),
                           "val_fraction": provenance.get("val_fraction"), "val_split": None,
                           "options": None, "from": "checkpoint provenance"}
    config, saved = _run_config(checkpoint)
    if isinstance(saved.get("recipe"), dict) and saved["recipe"].get("data_args"):
        out["options"] = dict(saved["recipe"]["data_args"])
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
    if out["options"] is None and provenance.get("recipe"):  # a checkpoint away from its run folder
        out["options"] = (_recipe_from_command(provenance["recipe"], provenance.get("command", "")) or {}).get(
            "data_args") or None
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
    the trainer records, which reproduces the run (see cli.train.canonical_command); its `data.KEY=VALUE` settings
    become the recipe's data_args."""
    from .training.recipes import get_recipe

    try:
        argv = shlex.split(command or "")
        # a run with --set changes is recorded as recipe 'custom': the command names the preset it started from
        recipe = get_recipe(next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--recipe"), name))
        sets = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]
        sets += [f"{flag[2:]}={argv[i + 1]}" for i, flag in enumerate(argv[:-1]) if flag in ("--seed", "--data")]
        keep = [s for s in sets if s.split("=", 1)[0] in ("seed", "val_fraction", "data", "data_args")
                or s.startswith("data.")]
        return recipe.override(keep).to_dict()
    except (VitkitError, ValueError):
        return None


# ------------------------------------------------------------------------------------------- detection
class LoadedDetector(torch.nn.Module):
    """A `task=detect` run's detector as one model: the backbone (the run's checkpoint) and torchvision's
    detector over it, its neck and head from `detection_head.safetensors` beside the checkpoint, inside the
    run's own `DetectTask`, so detections come from the task's `detect` (the eval's code path) and match the
    run's predictions.json. `forward(x)`: normalised images [B, C, H, W] at the input size -> torchvision's
    detections per image on those pixels; `detect(x, sizes)`: the same in each image's own pixels."""

    detects = True  # what predict, serve and export ask a model before treating it as a detector

    def __init__(self, model: torch.nn.Module, task, head_path: str):
        super().__init__()
        self.model, self.task, self.head_path = model, task, head_path
        self.detector = task.detector  # torchvision's (FCOS or Faster R-CNN), the backbone held by reference
        self.preprocess, self.class_names = model.preprocess, model.class_names
        self.num_classes, self.family = model.num_classes, getattr(model, "family", None)
        self.provenance = dict(getattr(model, "provenance", None) or {})
        self.options = task.opts.to_dict()  # {detector, dim, score_thresh, detections}

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        with self.detector.backbone.reading(self.model):
            return self.detector(list(x))

    @torch.no_grad()
    def detect(self, x: torch.Tensor, sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """Eval-transformed images [B, C, H, W] of original sizes (H, W) -> per image {boxes [n, 4] xyxy in its
        own pixels, scores [n], labels [n] (1..K-1)}, highest score first."""
        b = len(sizes)
        # the task reads each image's size and id from a target; the boxes it carries are not used here
        target = {"boxes": torch.zeros(b, 1, 4), "labels": torch.zeros(b, 1, dtype=torch.long),
                  "crowd": torch.zeros(b, 1, dtype=torch.bool), "area": torch.zeros(b, 1),
                  "count": torch.zeros(b, dtype=torch.long), "size": torch.tensor(sizes).reshape(b, 2),
                  "image_id": torch.arange(b)}
        return self.task.detect(self.model, x, target)


class OnnxDetector:
    """An exported detector in ONNX Runtime (an `OnnxRunner` of `export_detector_onnx`'s file) with
    LoadedDetector's `detect`: the graph's boxes on the input's pixels taken back to each image's own pixels
    by the task's inverse of the eval transform (`to_image_pixels`), as `DetectTask.detect` does."""

    detects = True

    def __init__(self, runner):
        self.runner = runner
        self.preprocess, self.class_names, self.num_classes = runner.preprocess, runner.class_names, runner.num_classes
        self.provenance, self.options = runner.provenance, runner.options
        self.family = runner.meta.get("family")

    def eval(self) -> OnnxDetector:
        return self

    def detect(self, x: torch.Tensor, sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
        from .training.tasks.detect import to_image_pixels

        return [{"boxes": to_image_pixels(d["boxes"].float(), tuple(size), self.preprocess),
                 "scores": d["scores"].float(), "labels": d["labels"].long()}
                for d, size in zip(self.runner.detections(x), sizes)]


def as_detector(model):
    """A model that `detect`s: a LoadedDetector as it is, an exported detector's ONNX runner wrapped
    (`OnnxDetector`); None for anything else (a classifier)."""
    if not getattr(model, "detects", False):
        return None
    return model if hasattr(model, "detect") else OnnxDetector(model)


def detection_head_of(checkpoint: str):
    """The `detection_head.safetensors` beside a checkpoint file (or in a run folder), or None: what makes a
    checkpoint a detector's. Bundled checkpoints, pretrained names and .onnx files have none."""
    from .training.tasks.detect import HEAD_FILE
    from .weights.io import resolve_path

    text = str(checkpoint)
    if text.startswith("bundled:") or text.lower().endswith(".onnx"):
        return None
    path = resolve_path(checkpoint)
    head = path.parent / HEAD_FILE
    return head if path.is_file() and head.is_file() else None


def load_detector(checkpoint: str) -> LoadedDetector | None:
    """The detector of a `task=detect` run (its folder, or a checkpoint file in it), or None when no
    detection head lies beside the checkpoint (a classifier). The head is the run's last (the one its
    predictions.json was made with)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from .api import load_model
    from .errors import CheckpointError
    from .training.recipes import Recipe
    from .training.tasks.detect import HEAD_META_KEY, DetectOptions, DetectTask
    from .weights.io import resolve_path

    head = detection_head_of(checkpoint)
    if head is None:
        return None
    path = resolve_path(checkpoint)
    try:
        with safe_open(str(head), "pt") as f:
            options = DetectOptions.from_dict(json.loads((f.metadata() or {})[HEAD_META_KEY]))
        state = load_file(str(head))
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{head}: not a vitkit detection head ({type(e).__name__}: {e})") from None
    model = load_model(path).eval()
    recipe = Recipe(task="detect", task_args=options.to_dict(), crop="none", bf16=False)
    task = DetectTask(recipe, model, num_classes=model.num_classes, device=torch.device("cpu")).eval()
    try:
        task.detector.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{head} does not fit {path} (another run's head?): "
                              f"{str(e).splitlines()[0]}") from None
    return LoadedDetector(model, task, str(head)).eval()


def detect_files(detector, paths, score_threshold: float = 0.0,
                 batch_size: int = 64) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """-> (predictions [{image, size [H, W], source, boxes: [{label, index, score, box [x0, y0, x1, y1]}]}],
    errors [{image, error}]): each file decoded and transformed as `predict_files` does, detected in batches
    (as the eval batches its loader), boxes in the image's own pixels, highest score first, those scoring at
    least `score_threshold`. `detector`: a `LoadedDetector` or an ONNX runner of one (its `detect`)."""
    tf = eval_transform(detector.preprocess)
    loaded, errors = [], []
    for path in paths:
        try:
            image = load_image(path, in_chans(detector))
            loaded.append((str(path), image, tf(image)))  # x: [C, H, W]
        except ImageError as e:
            errors.append({"image": str(path), "error": str(e)})
    names = detector.class_names
    preds = []
    for start in range(0, len(loaded), batch_size):
        chunk = loaded[start:start + batch_size]
        sizes = [(image.height, image.width) for _, image, _ in chunk]
        found = detector.detect(torch.stack([x for _, _, x in chunk]), sizes)  # [B, C, H, W] in
        for (path, image, _), size, d in zip(chunk, sizes, found):
            preds.append({"image": path, "size": list(size), "source": source_of(image),
                          "boxes": box_entries(d, names, score_threshold)})
    return preds, errors


DRAW_SIDE = 256  # drawn images are scaled up (nearest) to about this many pixels on the long side: labels stay legible
BOX_COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45", "#fabed4",
               "#469990", "#dcbeff", "#9a6324")  # one per class index, cycling


def draw_detections(image, boxes: list[dict[str, Any]], path) -> None:
    """`image` (PIL) with `box_entries` boxes drawn (torchvision's draw_bounding_boxes, "label score" on each, a
    colour per class), scaled up by a whole factor when small, written atomically to `path` as PNG."""
    import numpy as np
    from torchvision.utils import draw_bounding_boxes

    from ._files import atomic_path

    boxes = boxes[::-1]  # the lowest score drawn first, so the best box's label ends on top where boxes overlap
    rgb = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)  # [3, H, W] uint8
    scale = max(1, round(DRAW_SIDE / max(rgb.shape[1:])))
    big = rgb.repeat_interleave(scale, 1).repeat_interleave(scale, 2)  # [3, sH, sW], each pixel a square
    corners = torch.tensor([b["box"] for b in boxes], dtype=torch.float32).reshape(-1, 4) * scale  # [n, 4]
    from matplotlib import font_manager

    # a TrueType font (matplotlib's DejaVu Sans, always there) so the labels can be sized; PIL's bitmap one is tiny
    font = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans"))
    colours = [BOX_COLOURS[b["index"] % len(BOX_COLOURS)] for b in boxes]
    # labels in white on their box's colour: legible on any image, and where boxes overlap
    drawn = big if not boxes else draw_bounding_boxes(big, corners, [f"{b['label']} {b['score']:.2f}" for b in boxes],
                                                      colors=colours, width=max(1, scale // 2), font=font,
                                                      font_size=max(10, round(big.shape[-1] / 20)), fill_labels=True,
                                                      label_colors="white", label_background_colors=colours)
    from PIL import Image

    with atomic_path(path) as tmp:
        Image.fromarray(drawn.permute(1, 2, 0).numpy()).save(tmp, format="PNG")


def box_entries(detections: dict[str, Any], class_names, score_threshold: float = 0.0) -> list[dict[str, Any]]:
    """One image's detections (boxes [n, 4], scores [n], labels [n]) -> [{label, index, score, box}] scoring at
    least `score_threshold`, highest first (label: the index without names)."""
    scores = detections["scores"].float()
    order = scores.argsort(descending=True, stable=True).tolist()
    out = []
    for i in order:
        score, index = float(scores[i]), int(detections["labels"][i])
        if score >= score_threshold:
            out.append({"label": class_names[index] if class_names else str(index), "index": index, "score": score,
                        "box": [float(v) for v in detections["boxes"][i].tolist()]})
    return out


def coco_image_ids(preds: list[dict[str, Any]], detector, annotations: str | None) -> tuple[list[int], list[int] | None]:
    """(image_id per prediction, category id per label 1..K-1 or None) for COCO's results format: from the
    annotation file when given (an image matched by its `file_name`, the categories in id order, as data/coco.py
    numbers them), else 1, 2, ... in the order given and the labels themselves."""
    if annotations is None:
        return list(range(1, len(preds) + 1)), None
    from pathlib import Path

    from .data.coco import _read_coco

    coco = _read_coco(Path(annotations))
    categories = sorted(coco.dataset["categories"], key=lambda c: c["id"])
    classes = detector.class_names[1:] if detector.class_names else None
    if len(categories) != detector.num_classes - 1:
        raise DataError(f"{annotations} has {len(categories)} categories but the detector has "
                        f"{detector.num_classes - 1} classes ({', '.join(classes or [])})")
    named = [str(c.get("name", c["id"])) for c in categories]
    if classes and named != list(classes):
        wrong = next(i for i, (a, b) in enumerate(zip(named, classes)) if a != b)
        raise DataError(f"{annotations}: category {categories[wrong]['id']} is {named[wrong]!r} but the detector's "
                        f"class {wrong + 1} is {classes[wrong]!r} (the categories in id order are its classes)")
    by_name: dict[str, list[tuple[str, int]]] = {}
    for image_id, entry in coco.imgs.items():
        name = Path(str(entry.get("file_name", ""))).as_posix()
        by_name.setdefault(Path(name).name, []).append((name, int(image_id)))
    ids = []
    for p in preds:
        given = Path(p["image"]).resolve().as_posix()
        # the entry whose file_name is the longest tail of the path (images/a.png before a.png elsewhere)
        hits = sorted(((len(name), image_id) for name, image_id in by_name.get(Path(given).name, [])
                       if given == name or given.endswith("/" + name)), reverse=True)
        if not hits or (len(hits) > 1 and hits[0][0] == hits[1][0]):
            why = "no image entry" if not hits else "more than one image entry"
            raise DataError(f"{p['image']}: {why} of {annotations} has this file_name; give the images the "
                            "annotation file lists")
        ids.append(hits[0][1])
    return ids, [int(c["id"]) for c in categories]


def coco_detections(preds: list[dict[str, Any]], image_ids: list[int],
                    category_ids: list[int] | None) -> list[dict[str, Any]]:
    """`detect_files` predictions -> COCO's results format (the task's `coco_results`, same rounding)."""
    from .training.tasks.detect import coco_results

    return coco_results([{"image_id": i, "boxes": torch.tensor([b["box"] for b in p["boxes"]]).reshape(-1, 4),
                          "scores": torch.tensor([b["score"] for b in p["boxes"]]),
                          "labels": torch.tensor([b["index"] for b in p["boxes"]], dtype=torch.long)}
                         for p, i in zip(preds, image_ids)], category_ids)


def evaluate_detector_on(detector: LoadedDetector, data: str, *, split: str | None = None, seed: int = 0,
                         val_fraction: float = 0.0, batch_size: int = 256, strict: bool = False) -> dict[str, Any]:
    """COCO mAP (pycocotools' COCOeval: map, map_50, map_75, per_class, in %) and the detection loss of a
    detector on a split of box data (a COCO annotation file, canvas-digits-boxes): the run's own evaluation
    (`DetectTask.evaluate`) on the data pipeline's eval loader."""
    bundle, split, ds = load_eval_split(data, channels=in_chans(detector.model), split=split, seed=seed,
                                        val_fraction=val_fraction, strict=strict)
    names = bundle.class_names
    if detector.num_classes != len(names):
        raise DataError(f"the detector has {detector.num_classes} classes (with the background) but {data} has "
                        f"{len(names)}")
    metrics = detector.task.evaluate(detector.model, eval_loader(ds, detector.preprocess, batch_size=batch_size))
    return {"data": bundle.name, "split": split, "count": len(ds), "split_from": describe_split(bundle, split),
            "map": metrics["map"], "map_50": metrics["map_50"], "map_75": metrics["map_75"],
            "per_class": metrics["per_class"], "loss": metrics["loss"], "class_names": names,
            "skipped_images": bundle.info.get("num_skipped", 0)}
