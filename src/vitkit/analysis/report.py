"""The analysis reports behind `vitkit analyze` and `vitkit explain`, as library calls: figures and
tables written to files, and a dict that says what was found and where it went."""
from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..models import require


def analyze(model, images: Sequence, out_dir: str | os.PathLike, *, label: str | None = None,
            sample: str | None = None, batch_size: int = 64, components: int = 28,
            object_mass_threshold: float | None = None, checkpoint: str | os.PathLike | None = None) -> dict[str, Any]:
    """The ViT paper's looks inside a model, over a sample of PIL images, written into `out_dir`:

    attention_distance.csv + attention_distance.png (mean attention distance per head per layer),
    pos_embed_similarity.png (position embeddings, when the model has them), patch_filters_pca.png
    (principal components of the patch filters) and summary.json; with `object_mass_threshold`, the
    share of rollout mass on object pixels (channel mean above it). `label` names the model in the
    figure titles (default: from `checkpoint` and the model's arch), `sample` describes the images.
    Returns the summary (what summary.json holds).
    """
    from .attention import object_mass
    from .distance import model_attention_distance
    from .embeddings import patch_filter_components, pos_embed_similarity
    from .figures import distance_figure, filter_components_figure, model_label, pos_similarity_figure
    from .inputs import prepare

    require(model, "attention_maps", "analyze")
    if not images:
        raise ConfigError("analyze needs at least one image")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = label or model_label(model, checkpoint or "model")
    sample = sample or f"{len(images)} images"
    xs, raws = zip(*(prepare(model, im) for im in images))
    x, raw = torch.cat(xs), torch.stack(raws)  # [N, C, H, W] normalised / in [0, 1]
    device = next(model.parameters()).device
    files: dict[str, Path] = {}

    # mean attention distance per head per layer, averaged over images
    per_image = torch.cat([model_attention_distance(model, x[i:i + batch_size].to(device)).cpu()
                           for i in range(0, len(x), batch_size)])  # [N, L, H]
    mad, spread = per_image.mean(0), per_image.std(0, unbiased=False)  # [L, H]
    L, H = mad.shape
    files["distance_csv"] = out / "attention_distance.csv"
    with open(files["distance_csv"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layer", "head", "mean_distance_px", "std_over_images_px"])
        for layer in range(L):
            for head in range(H):
                w.writerow([layer + 1, head, f"{mad[layer, head]:.4f}", f"{spread[layer, head]:.4f}"])
    side = max(x.shape[-2], x.shape[-1])
    files["distance_png"] = distance_figure(
        mad, out / "attention_distance.png", f"{name}\nmean attention distance over {sample}", image_extent=side)

    # position embeddings
    sim = pos_embed_similarity(model)
    pos_note = {"learn": "learned", "sincos": "fixed 2D sin-cos (not learned)"}.get(model.cfg.pos_embed)
    if sim is not None:
        files["pos_embed_png"] = pos_similarity_figure(
            sim, out / "pos_embed_similarity.png",
            f"{name}\nposition embedding similarity ({pos_note}; from the weights, no sample)")
    else:
        pos_note = "no position embedding: figure skipped"

    # patch-embedding filters
    comps, explained = patch_filter_components(model, components)
    files["filters_png"] = filter_components_figure(
        comps, explained, out / "patch_filters_pca.png",
        f"{name}\nfirst {len(comps)} principal components of the patch-embedding filters (from the weights)")

    summary: dict[str, Any] = {
        "checkpoint": None if checkpoint is None else str(checkpoint), "model": name, "sample": sample,
        "images": len(images), "input_size": [int(x.shape[-2]), int(x.shape[-1])],
        "mean_distance_px": [[round(float(v), 3) for v in row] for row in mad],
        "per_layer_mean_px": [round(float(v), 3) for v in mad.mean(1)],
        "pos_embed": pos_note,
        "filter_components": len(comps),
        "filter_variance_explained": round(float(explained.sum()), 4),
    }
    if object_mass_threshold is not None:
        summary["object_mass"] = object_mass(model.to(device), raw, object_mass_threshold,
                                             batch_size=batch_size) | {"threshold": object_mass_threshold}
    files["summary"] = out / "summary.json"
    summary["files"] = {k: str(v) for k, v in files.items()}
    files["summary"].write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def top_classes(logits: torch.Tensor, class_names: Sequence[str] | None = None, k: int = 5) -> list[dict[str, Any]]:
    """The k most probable classes of one image's logits [K]: class index, name (or None), probability."""
    probs = logits.float().softmax(-1)
    values, idx = probs.topk(min(k, probs.numel()))
    return [{"class": int(i), "name": class_names[i] if class_names else None, "prob": round(float(v), 4)}
            for v, i in zip(values, idx)]


def peak_patch(amap: torch.Tensor) -> tuple[int, int]:
    """(row, col) of the largest value of a [Gh, Gw] map."""
    peak = int(torch.argmax(amap.float()))
    return peak // amap.shape[-1], peak % amap.shape[-1]


def explain_paths(images: Sequence[str | os.PathLike], method: str,
                  out: str | os.PathLike | None = None) -> list[Path]:
    """Where `explain` writes the heat map of each image (the per-head grid goes beside it as *-heads.png).

    The method is in every default name, so rollout and grad-rollout of one image never overwrite each
    other. `out`:

    - None: IMAGE_STEM-METHOD.png in the current folder, for each image;
    - a folder (an existing one, or a name ending in '/' or without a suffix; created):
      FOLDER/IMAGE_STEM-METHOD.png;
    - a pattern with '{stem}', '{method}' and/or '{index}' (1-based), e.g. 'maps/{stem}-{method}.png';
    - a file name with a suffix (FILE.png; written as PNG whatever the suffix): that file, for ONE image only.

    Two images with the same stem (a/cat.png, b/cat.jpg) get their position added (cat-1-rollout.png,
    cat-2-rollout.png); a pattern that would give two images one file is refused.
    """
    images = [Path(p) for p in images]
    if not images:
        raise ConfigError("explain needs at least one image")
    stems = [p.stem for p in images]
    dup = {s for s in stems if stems.count(s) > 1}
    text = None if out is None else str(out)
    if text is not None and "{" in text:
        try:
            paths = [Path(text.format(stem=s, method=method, index=i + 1)) for i, s in enumerate(stems)]
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"--out pattern {text!r}: use only {{stem}}, {{method}} and {{index}} ({e})") from None
        paths = [p if p.suffix.lower() == ".png" else p.with_name(p.name + ".png") for p in paths]
        if len(set(paths)) < len(paths):
            raise ConfigError(f"--out pattern {text!r} gives several images the same file name: "
                              "add {stem} or {index}")
        return paths
    is_file = text is not None and bool(Path(text).suffix) and not Path(text).is_dir() \
        and not text.endswith(("/", os.sep))
    if is_file:
        if len(images) > 1:
            raise ConfigError(f"--out {text} names one file but {len(images)} images were given: pass a folder "
                              "(--out DIR) or a pattern such as --out 'maps/{stem}-{method}.png'")
        return [Path(text)]
    folder = Path(text) if text is not None else Path()
    return [folder / (f"{s}-{i + 1}-{method}.png" if s in dup else f"{s}-{method}.png") for i, s in enumerate(stems)]


def explain_image(model, image, out: str | os.PathLike, *, method: str = "rollout", target: int | None = None,
                  head_fusion: str = "mean", discard_ratio: float = 0.0,
                  size: int | tuple[int, int] | None = None, label: str | None = None,
                  image_name: str | None = None) -> dict[str, Any]:
    """Where the model looks in one image: the heat map over the image (`out`, PNG) and the per-head grid
    of last-layer attention next to it (*-heads.png).

    `image` is a PIL image or an image file; `size` an input size other than the model's (an int or
    (H, W), any multiple of the patch size). `method` is rollout, cls-attention or grad-rollout (for
    class `target`, default the predicted one). The image goes through predict's eval geometry (shorter
    side resized, centre crop: `inputs.prepare`). Returns the top-5 classes, the target, the peak patch,
    the input and grid sizes, the files written and what the file was (`source`, when it was a file).
    """
    from ..data.images import image_source
    from .attention import explain
    from .figures import head_grid_figure, model_label, overlay_figure
    from .inputs import load_image, prepare

    require(model, "attention_maps", "explain")
    if not 0.0 <= discard_ratio < 1.0:
        raise ConfigError(f"discard ratio must be in [0, 1), got {discard_ratio}")
    if isinstance(image, (str, os.PathLike)):
        image_name = image_name or str(image)
        image = load_image(image, model.cfg.in_chans)
    image_name = image_name or "image"
    if target is not None and not 0 <= target < model.num_classes:
        raise ConfigError(f"class {target} out of range: the model has {model.num_classes} classes")
    size = (size, size) if isinstance(size, int) else size
    src = image_source(image)
    x, raw = prepare(model, image, size)
    amap, logits, heads = explain(model, x, method, target, head_fusion, discard_ratio)

    out = Path(out)
    heads_out = out.with_name(out.stem + "-heads.png")
    name = label or model_label(model, "model")
    names = model.class_names
    top = top_classes(logits[0], names) if model.num_classes else []  # a headless model returns features
    shown = target if target is not None else (top[0]["class"] if top else None)
    shown_text = "" if shown is None else f"class {shown}" + (f" ({names[shown]})" if names else "")
    caption = method + (f", heads {head_fusion}" if method != "grad-rollout" else "")
    if discard_ratio:
        caption += f", discard {discard_ratio:g}"
    title = f"{name}\n{Path(image_name).name} at {x.shape[-2]}x{x.shape[-1]}"
    overlay_figure(raw, amap[0], out, title, caption=f"{caption}; {shown_text}" if shown_text else caption)
    head_grid_figure(raw, heads[0], heads_out, f"{name}\n{Path(image_name).name}: last-layer "
                     f"{'[class]' if model.cls_token is not None else 'mean patch'} attention per head")
    gh, gw = amap.shape[-2:]
    return {
        "image": image_name, "method": method, "caption": caption, "head_fusion": head_fusion,
        "discard_ratio": discard_ratio, "input_size": [int(x.shape[-2]), int(x.shape[-1])], "grid": [int(gh), int(gw)],
        "target": shown, "top": top, "peak_patch": list(peak_patch(amap[0])), "out": str(out), "heads_out": str(heads_out),
        "source": None if src is None else dict(zip(("width", "height", "channels", "mode"), src)),
    }
