"""`vitkit explain CKPT IMAGE`: where the model looks, as a heat map over the image (PNG); the work is
vitkit.analysis.report.explain_image."""
from __future__ import annotations

from pathlib import Path

from .common import add_json, emit, img_size, print_table


def register(sub) -> None:
    p = sub.add_parser("explain", help="attention heat map of one image (rollout, class-token attention, "
                       "gradient-weighted rollout) written as PNG")
    p.add_argument("checkpoint", help="model file (vitkit safetensors or any importable checkpoint)")
    p.add_argument("image", help="image file")
    p.add_argument("--method", choices=("rollout", "cls-attention", "grad-rollout"), default="rollout",
                   help="rollout: attention rollout over all layers (default); cls-attention: the last "
                   "layer's [class]-token attention; grad-rollout: rollout weighted by the gradient of a class")
    p.add_argument("--class", dest="target", type=int, metavar="K",
                   help="class index for grad-rollout (default: the predicted class)")
    p.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean",
                   help="how heads are combined (rollout, cls-attention)")
    p.add_argument("--discard-ratio", type=float, default=0.0, metavar="R",
                   help="zero the lowest R of each attention row before rollout (0 <= R < 1)")
    p.add_argument("--img-size", type=img_size, metavar="HxW",
                   help="run at this input size instead of the model's (any multiple of the patch size)")
    p.add_argument("--out", metavar="FILE.png", help="heat map PNG (default: IMAGE_STEM-METHOD.png here); "
                   "the per-head grid of last-layer attention goes next to it as *-heads.png")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..analysis.figures import model_label
    from ..analysis.report import explain_image
    from ..api import load_model
    from ..errors import ConfigError

    if not 0.0 <= args.discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    if args.target is not None and args.method != "grad-rollout":
        raise ConfigError("--class only applies to --method grad-rollout")
    model = load_model(args.checkpoint).eval()
    out = Path(args.out) if args.out else Path(f"{Path(args.image).stem}-{args.method}.png")
    info = explain_image(model, args.image, out, method=args.method, target=args.target,
                         head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, size=args.img_size,
                         label=model_label(model, args.checkpoint))
    info = {"checkpoint": str(args.checkpoint)} | info

    def render(d):
        gh, gw = d["grid"]
        rows = [("method", d["caption"]), ("input / grid", (f"{d['input_size'][0]}x{d['input_size'][1]} / "
                                                           f"{gh}x{gw} patches")),
                ("peak patch (row, col)", tuple(d["peak_patch"]))]
        rows += [(f"top {i + 1}", f"{t['class']}{' ' + t['name'] if t['name'] else ''}  p={t['prob']:.3f}")
                 for i, t in enumerate(d["top"][:3])]
        rows += [("heat map", d["out"]), ("per-head grid", d["heads_out"])]
        print_table(f"explain {args.image}", ["field", "value"], rows)

    emit(args, info, render)
    return 0
