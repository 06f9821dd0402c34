"""`vitkit explain CKPT IMAGE...`: where the model looks, as a heat map over each image (PNG, with a colour
bar) and the per-head grid beside it; the work is vitkit.analysis.report.explain_image, the file names
vitkit.analysis.report.explain_paths."""
from __future__ import annotations

import sys

from .common import add_json, emit, img_size, print_table
from .export import add_max_tokens


def register(sub) -> None:
    p = sub.add_parser("explain", help="attention heat maps of images (rollout, class-token attention, "
                       "gradient-weighted rollout) written as PNG")
    p.add_argument("checkpoint", help="model file (vitkit safetensors or any importable checkpoint)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files; one heat map and head grid each")
    p.add_argument("--method", choices=("rollout", "cls-attention", "grad-rollout", "pca", "match"),
                   default="rollout",
                   help="rollout: attention rollout over all layers (default); cls-attention: the last "
                   "layer's [class]-token attention; grad-rollout: rollout weighted by the gradient of a class; "
                   "pca: the patch features' first three principal components as RGB, background removed "
                   "(DINOv2's recipe; any family; a larger --img-size gives a finer map); match: lines between "
                   "the mutually best-matching patches of two images")
    p.add_argument("--matches", type=int, default=20, metavar="N", help="--method match: at most N lines")
    p.add_argument("--class", dest="target", type=int, metavar="K",
                   help="class index for grad-rollout (default: the predicted class)")
    p.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean",
                   help="how heads are combined (rollout, cls-attention)")
    p.add_argument("--discard-ratio", type=float, default=0.0, metavar="R",
                   help="zero the lowest R of each attention row before rollout (0 <= R < 1)")
    p.add_argument("--img-size", type=img_size, metavar="HxW",
                   help="run at this input size instead of the model's (any multiple of the patch size)")
    add_max_tokens(p)
    p.add_argument("--out", metavar="DIR|PATTERN|FILE.png",
                   help="where the heat maps go (default: IMAGE_STEM-METHOD.png here, so methods never overwrite "
                   "each other): a folder (DIR/IMAGE_STEM-METHOD.png), a pattern with {stem}, {method}, {index} "
                   "(e.g. 'maps/{stem}-{method}.png'), or FILE.png for a single image; the per-head grid of "
                   "last-layer attention goes next to each as *-heads.png")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..analysis.figures import model_label
    from ..analysis.report import explain_image, explain_paths
    from ..api import load_model
    from ..errors import ConfigError, ImageError
    from ..inference import input_note

    if args.method in ("pca", "match"):
        return _run_dense(args)
    if not 0.0 <= args.discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    if args.target is not None and args.method != "grad-rollout":
        raise ConfigError("--class only applies to --method grad-rollout")
    outs = explain_paths(args.images, args.method, args.out)  # refuse a bad --out before any work
    model = load_model(args.checkpoint, max_tokens=args.max_tokens).eval()
    label = model_label(model, args.checkpoint)
    done, errors = [], []
    for image, out in zip(args.images, outs):
        try:
            done.append(explain_image(model, image, out, method=args.method, target=args.target,
                                      head_fusion=args.head_fusion, discard_ratio=args.discard_ratio,
                                      size=args.img_size, label=label))
        except ImageError as e:  # one unreadable file does not lose the others
            errors.append({"image": str(image), "error": str(e)})
    info = {"checkpoint": str(args.checkpoint), "method": args.method, "images": done, "errors": errors}
    note = input_note(model, done)
    if note:  # once per command, on stderr: --json stdout stays pure JSON
        print(note, file=sys.stderr)

    def render(d):
        if len(d["images"]) == 1:
            e = d["images"][0]
            gh, gw = e["grid"]
            rows = [("method", e["caption"]), ("input / grid", (f"{e['input_size'][0]}x{e['input_size'][1]} / "
                                                               f"{gh}x{gw} patches")),
                    ("peak patch (row, col)", tuple(e["peak_patch"]))]
            rows += [(f"top {i + 1}", f"{t['class']}{' ' + t['name'] if t['name'] else ''}  p={t['prob']:.3f}")
                     for i, t in enumerate(e["top"][:3])]
            rows += [("heat map", e["out"]), ("per-head grid", e["heads_out"])]
            print_table(f"explain {e['image']}", ["field", "value"], rows)
        elif d["images"]:
            rows = [(e["image"], (f"{e['top'][0]['name'] or e['top'][0]['class']} p={e['top'][0]['prob']:.3f}"
                                  if e["top"] else "-"), e["out"], e["heads_out"]) for e in d["images"]]
            print_table(f"explain ({d['method']}, {d['checkpoint']})", ["image", "top-1", "heat map", "per-head grid"],
                        rows, justify=["left"] * 4)

    emit(args, info, render)
    for e in errors:  # one line per broken file, whatever the output format
        print(f"vitkit explain: error: {e['error']}", file=sys.stderr)
    return 2 if errors else 0


def _run_dense(args) -> int:
    """--method pca (one map per image) and --method match (two images, one figure)."""
    from ..analysis.dense import explain_match, explain_pca
    from ..analysis.figures import model_label
    from ..analysis.report import explain_paths
    from ..api import load_model
    from ..errors import ConfigError, ImageError

    if args.method == "match" and len(args.images) != 2:
        raise ConfigError(f"--method match takes two images, got {len(args.images)}")
    if args.matches < 1:
        raise ConfigError(f"--matches must be >= 1, got {args.matches}")
    outs = explain_paths(args.images[:1] if args.method == "match" else args.images, args.method, args.out)
    model = load_model(args.checkpoint, max_tokens=args.max_tokens).eval()
    if args.method == "match":
        info = explain_match(model, *args.images, outs[0], size=args.img_size, top=args.matches)
        emit(args, info, lambda d: print(f"{len(d['matches'])} mutual patch matches drawn: {d['out']}"))
        return 0
    done, errors = [], []
    label = model_label(model, args.checkpoint)
    for image, out in zip(args.images, outs):
        try:
            done.append(explain_pca(model, image, out, size=args.img_size, label=label))
        except ImageError as e:  # one unreadable file does not lose the others
            errors.append({"image": str(image), "error": str(e)})
    info = {"checkpoint": str(args.checkpoint), "method": "pca", "images": done, "errors": errors}
    emit(args, info, lambda d: [print(f"{e['image']}: PCA map of a {e['grid'][0]}x{e['grid'][1]} grid, "
                                      f"{e['foreground_patches']} foreground patches: {e['out']}") for e in d["images"]])
    for e in errors:
        print(f"vitkit explain: {e['image']}: {e['error']}", file=sys.stderr)
    return 1 if errors else 0
