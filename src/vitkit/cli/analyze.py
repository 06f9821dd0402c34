"""`vitkit analyze CKPT --data D --out DIR/`: the ViT paper's looks inside a model, over a sample.

Writes into DIR: attention_distance.csv + attention_distance.png (mean attention distance per head
per layer), pos_embed_similarity.png (learned position embeddings), patch_filters_pca.png (principal
components of the patch filters), summary.json; with --object-mass, the rollout mass on the object.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .common import add_json, emit, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("analyze", help="mean attention distance, position-embedding similarity and patch-filter "
                       "components over a sample of images, as figures + CSV")
    p.add_argument("checkpoint", help="model file (vitkit safetensors or any importable checkpoint)")
    p.add_argument("--data", required=True, metavar="DATA",
                   help="image folder, glob pattern ('imgs/**/*.jpg'), image file, or a built-in dataset: "
                   "digits, fashion-mnist (their test split; NAME:train for the training split)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--samples", type=positive_int, default=128, metavar="N",
                   help="images drawn from the data (default 128, as in the ViT paper)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random sample")
    p.add_argument("--components", type=positive_int, default=28, metavar="K",
                   help="principal components of the patch filters to draw (default 28)")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--object-mass", type=float, metavar="THRESHOLD",
                   help="also measure the share of rollout mass on object pixels (channel mean > THRESHOLD, "
                   "pixels in [0, 1]) against the object's share of the image")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..analysis.attention import object_mass
    from ..analysis.distance import model_attention_distance
    from ..analysis.embeddings import patch_filter_components, pos_embed_similarity
    from ..analysis.figures import (
        distance_figure,
        filter_components_figure,
        model_label,
        pos_similarity_figure,
    )
    from ..analysis.inputs import prepare, sample_images
    from ..api import load_model

    model = load_model(args.checkpoint).eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = model_label(model, args.checkpoint)
    images, sample = sample_images(args.data, args.samples, model.cfg.in_chans, args.seed)
    xs, raws = zip(*(prepare(model, im) for im in images))
    x, raw = torch.cat(xs), torch.stack(raws)  # [N, C, H, W] normalised / in [0, 1]
    device = next(model.parameters()).device
    files = {}

    # mean attention distance per head per layer, averaged over images
    per_image = torch.cat([model_attention_distance(model, x[i:i + args.batch_size].to(device)).cpu()
                           for i in range(0, len(x), args.batch_size)])  # [N, L, H]
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
        mad, out / "attention_distance.png",
        f"{name}\nmean attention distance over {sample}", image_extent=side)

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
    comps, explained = patch_filter_components(model, args.components)
    files["filters_png"] = filter_components_figure(
        comps, explained, out / "patch_filters_pca.png",
        f"{name}\nfirst {len(comps)} principal components of the patch-embedding filters (from the weights)")

    summary = {
        "checkpoint": str(args.checkpoint), "model": name, "sample": sample, "images": len(images),
        "input_size": [int(x.shape[-2]), int(x.shape[-1])],
        "mean_distance_px": [[round(float(v), 3) for v in row] for row in mad],
        "per_layer_mean_px": [round(float(v), 3) for v in mad.mean(1)],
        "pos_embed": pos_note,
        "filter_variance_explained": round(float(explained.sum()), 4),
    }
    if args.object_mass is not None:
        summary["object_mass"] = object_mass(model.to(device), raw, args.object_mass,
                                             batch_size=args.batch_size) | {"threshold": args.object_mass}
    summary["files"] = {k: str(v) for k, v in files.items()}
    files["summary"] = out / "summary.json"
    summary["files"]["summary"] = str(files["summary"])
    files["summary"].write_text(json.dumps(summary, indent=2) + "\n")

    def render(d):
        rows = [("model", d["model"]), ("sample", d["sample"]),
                ("distance by layer (px)", "  ".join(f"{v:.1f}" for v in d["per_layer_mean_px"])),
                ("position embedding", d["pos_embed"]),
                (f"filter PCs variance ({len(comps)})", f"{100 * d['filter_variance_explained']:.1f}%")]
        if "object_mass" in d:
            om = d["object_mass"]
            rows.append(("rollout mass on object", (f"{om['mass']:.3f} vs share {om['share']:.3f} "
                                                     f"(x{om['lift']:.2f})")))
        rows += [(k, v) for k, v in d["files"].items()]
        print_table(f"analyze {args.checkpoint}", ["field", "value"], rows)

    emit(args, summary, render)
    return 0
