"""`vitkit analyze CKPT --data D --out DIR/`: the ViT paper's looks inside a model, over a sample.

Writes into DIR: attention_distance.csv + attention_distance.png (mean attention distance per head
per layer), pos_embed_similarity.png (learned position embeddings), patch_filters_pca.png (principal
components of the patch filters), summary.json; with --object-mass, the rollout mass on the object.
The work is done by vitkit.analysis.report.analyze; this module parses, calls it and prints.
"""
from __future__ import annotations

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
    from ..analysis.figures import model_label
    from ..analysis.inputs import sample_images
    from ..analysis.report import analyze
    from ..api import load_model

    model = load_model(args.checkpoint).eval()
    images, sample = sample_images(args.data, args.samples, model.cfg.in_chans, args.seed)
    summary = analyze(model, images, args.out, label=model_label(model, args.checkpoint), sample=sample,
                      batch_size=args.batch_size, components=args.components,
                      object_mass_threshold=args.object_mass, checkpoint=args.checkpoint)

    def render(d):
        rows = [("model", d["model"]), ("sample", d["sample"]),
                ("distance by layer (px)", "  ".join(f"{v:.1f}" for v in d["per_layer_mean_px"])),
                ("position embedding", d["pos_embed"]),
                (f"filter PCs variance ({d['filter_components']})", f"{100 * d['filter_variance_explained']:.1f}%")]
        if "object_mass" in d:
            om = d["object_mass"]
            rows.append(("rollout mass on object", (f"{om['mass']:.3f} vs share {om['share']:.3f} "
                                                     f"(x{om['lift']:.2f})")))
        rows += [(k, v) for k, v in d["files"].items()]
        print_table(f"analyze {args.checkpoint}", ["field", "value"], rows)

    emit(args, summary, render)
    return 0
