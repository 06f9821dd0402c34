"""`vitkit explain CKPT IMAGE`: where the model looks, as a heat map over the image (PNG)."""
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
    import torch

    from ..analysis.attention import explain
    from ..analysis.figures import head_grid_figure, model_label, overlay_figure
    from ..analysis.inputs import load_image, prepare
    from ..errors import ConfigError
    from ..api import load_model

    if not 0.0 <= args.discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    if args.target is not None and args.method != "grad-rollout":
        raise ConfigError("--class only applies to --method grad-rollout")
    model = load_model(args.checkpoint).eval()
    image = load_image(args.image, model.cfg.in_chans)  # before any work: a broken file fails fast
    size = (args.img_size, args.img_size) if isinstance(args.img_size, int) else args.img_size
    x, raw = prepare(model, image, size)
    if args.target is not None and not 0 <= args.target < model.num_classes:
        raise ConfigError(f"--class {args.target} out of range: the model has {model.num_classes} classes")
    amap, logits, heads = explain(model, x, args.method, args.target, args.head_fusion, args.discard_ratio)

    out = Path(args.out) if args.out else Path(f"{Path(args.image).stem}-{args.method}.png")
    heads_out = out.with_name(out.stem + "-heads.png")
    name = model_label(model, args.checkpoint)
    names = model.class_names
    top = []
    if model.num_classes:  # headless models (num_classes=0) return features
        probs = logits.float().softmax(-1)[0]
        values, idx = probs.topk(min(5, probs.numel()))
        top = [{"class": int(i), "name": names[i] if names else None, "prob": round(float(v), 4)}
               for v, i in zip(values, idx)]
    shown = args.target if args.target is not None else (top[0]["class"] if top else None)
    label = "" if shown is None else f"class {shown}" + (f" ({names[shown]})" if names else "")
    method = args.method + (f", heads {args.head_fusion}" if args.method != "grad-rollout" else "")
    if args.discard_ratio:
        method += f", discard {args.discard_ratio:g}"
    title = f"{name}\n{Path(args.image).name} at {x.shape[-2]}x{x.shape[-1]}"
    overlay_figure(raw, amap[0], out, title, caption=f"{method}; {label}" if label else method)
    head_grid_figure(raw, heads[0], heads_out, f"{name}\n{Path(args.image).name}: last-layer "
                     f"{'[class]' if model.cls_token is not None else 'mean patch'} attention per head")
    gh, gw = amap.shape[-2:]
    m = amap[0].float()
    peak = int(torch.argmax(m))
    info = {
        "checkpoint": str(args.checkpoint), "image": str(args.image), "method": args.method,
        "head_fusion": args.head_fusion, "discard_ratio": args.discard_ratio,
        "input_size": [int(x.shape[-2]), int(x.shape[-1])], "grid": [int(gh), int(gw)],
        "target": shown, "top": top, "peak_patch": [peak // gw, peak % gw],
        "out": str(out), "heads_out": str(heads_out),
    }

    def render(d):
        rows = [("method", method), ("input / grid", (f"{d['input_size'][0]}x{d['input_size'][1]} / "
                                                       f"{gh}x{gw} patches")),
                ("peak patch (row, col)", tuple(d["peak_patch"]))]
        rows += [(f"top {i + 1}", f"{t['class']}{' ' + t['name'] if t['name'] else ''}  p={t['prob']:.3f}")
                 for i, t in enumerate(d["top"][:3])]
        rows += [("heat map", d["out"]), ("per-head grid", d["heads_out"])]
        print_table(f"explain {args.image}", ["field", "value"], rows)

    emit(args, info, render)
    return 0
