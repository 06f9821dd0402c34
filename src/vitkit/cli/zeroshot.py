"""`vitkit zeroshot CKPT IMAGE... --labels "cat,dog"`: classify images by class names with a CLIP pair."""
from __future__ import annotations

import sys

from .common import add_json, emit, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("zeroshot", help="classify images by class names in words with a CLIP pair (no training)")
    p.add_argument("checkpoint", help="a CLIP pair: a clip-family .safetensors, an OpenAI / open_clip checkpoint with "
                   "both towers, or clip_vit_base_patch32.openai (open_clip's file via the Hugging Face cache)")
    p.add_argument("images", nargs="+", help="image files (any format Pillow reads)")
    add_zeroshot_args(p, labels_required=True)
    p.add_argument("--top-k", type=positive_int, default=3)
    p.add_argument("--save", metavar="OUT.safetensors", default=None,
                   help="also write the pair with this classifier as its head: `vitkit predict/eval OUT` then run it")
    add_json(p)
    p.set_defaults(func=run)


def add_zeroshot_args(p, labels_required: bool) -> None:
    """--labels, --templates and the options foreign CLIP files need (shared with `vitkit eval --zeroshot`)."""
    p.add_argument("--labels", required=labels_required, default=None,
                   help="class names, comma-separated (\"cat,dog,bird\"), or a file with one per line" +
                   ("" if labels_required else " (default: the data's class names)"))
    p.add_argument("--templates", default="imagenet",
                   help="prompt templates: imagenet (OpenAI's 80, the default), simple (\"a photo of a {}.\"), or a "
                   "text file with one template per line, {} where the class name goes")
    p.add_argument("--act", choices=["quick_gelu", "gelu"], default="quick_gelu",
                   help="activation of a foreign checkpoint, which does not record it: quick_gelu for OpenAI's "
                   "weights (default), gelu for open_clip's LAION / DataComp ones")


def load_zeroshot(args, labels: list[str]):
    """The pair from args.checkpoint with the zero-shot classifier for `labels` as its head."""
    from ..zeroshot import attach_classifier, load_clip

    model = load_clip(args.checkpoint, act=args.act)
    return attach_classifier(model, labels, args.templates)


def run(args) -> int:
    from ..inference import predict_files
    from ..zeroshot import load_templates, parse_labels

    labels = parse_labels(args.labels)
    load_templates(args.templates)  # a bad template file is refused before the model is read
    model = load_zeroshot(args, labels)
    preds, errors = predict_files(model, args.images, args.top_k)
    out = {"checkpoint": str(args.checkpoint), "labels": labels, "templates": args.templates,
           "num_templates": model.provenance["zeroshot"]["num_templates"], "predictions": preds, "errors": errors}
    if args.save:
        from ..api import save_model

        out["saved"] = str(save_model(model, args.save))

    def render(d):
        rows = [(p["image"], ", ".join(f"{t['label']} {100 * t['prob']:.1f}%" for t in p["top"]))
                for p in d["predictions"]]
        if rows:
            print_table(f"zero-shot ({d['checkpoint']}, {d['num_templates']} template(s) per class)",
                        ["image", f"top-{args.top_k}"], rows, justify=["left", "left"])
        if d.get("saved"):
            print(f"wrote {d['saved']} (the pair with this zero-shot classifier as its head)")

    emit(args, out, render)
    for e in errors:  # one line per broken file, whatever the output format
        print(f"vitkit zeroshot: error: {e['error']}", file=sys.stderr)
    return 2 if errors else 0
