"""`vitkit convert SRC OUT.safetensors`: any supported checkpoint -> vitkit safetensors with metadata."""
from __future__ import annotations

import argparse

from .common import add_json, emit, print_table


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 0.5,0.5,0.5; got {text!r}") from None
    return values


def register(sub) -> None:
    p = sub.add_parser("convert", help="import a checkpoint (timm, HF, JAX npz, DeiT/MAE/DINO/DINOv2, CLIP, "
                       "timm/original Swin) into vitkit safetensors")
    p.add_argument("src", help="checkpoint file, HF model folder, run folder or pretrained name.tag")
    p.add_argument("out", help="output .safetensors path")
    p.add_argument("--model", help="registered architecture to load into, with its preprocessing (default: read "
                   "the architecture off the weights)")
    p.add_argument("--mean", type=_floats, metavar="M,M,M", help="input normalisation mean to record (per channel)")
    p.add_argument("--std", type=_floats, metavar="S,S,S", help="input normalisation std to record (per channel)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import dataclasses

    from ..api import load_model, save_model
    from ..errors import ConfigError

    model = load_model(args.src, model_name=args.model)
    pre = model.preprocess
    for flag in ("mean", "std"):
        values = getattr(args, flag)
        if values is not None:
            chans = pre.input_size[0]
            if len(values) not in (1, chans):
                raise ConfigError(f"--{flag} needs 1 or {chans} values (the model has {chans} channels)")
            pre = dataclasses.replace(pre, **{flag: tuple(values) * (chans // len(values))})
    prov = {"converted_from": str(args.src)}
    if args.mean or args.std:
        prov["preprocess_from"] = "--mean/--std"
    elif args.model:
        prov["preprocess_from"] = args.model
    out = save_model(model, args.out, provenance=prov, preprocess=pre)
    cfg = model.cfg
    info = {
        "out": str(out),
        "layout": model.provenance.get("imported_from"),
        "family": model.family,
        "params": sum(p.numel() for p in model.parameters()),
        "config": cfg.to_dict(),
        "preprocess": pre.to_dict(),
        "preprocess_from": prov.get("preprocess_from") or model.provenance.get("preprocess_from") or "the checkpoint",
        "classes": len(model.class_names) if model.class_names else None,
    }

    def render(d):
        rows = [("layout", d["layout"]), ("family", d["family"]), ("params", f"{d['params']:,}")]
        rows += _architecture_rows(d["config"])
        rows += [("img", f"{cfg.img_size[0]}x{cfg.img_size[1]}"), ("classes", cfg.num_classes),
                 ("mean / std", f"{_short(pre.mean)} / {_short(pre.std)}"),
                 # its own row: the source often ends in "(guessed)", which nested in parentheses read "...))"
                 ("preprocess from", d["preprocess_from"]), ("written", d["out"])]
        # values left-aligned: a long path that has to fold still reads from its start
        print_table(f"converted {args.src}", ["field", "value"], rows, justify=["left", "left"])

    emit(args, info, render)
    return 0


def _architecture_rows(config: dict) -> list[tuple[str, str]]:
    """Width, depth and heads, patch and window, as far as the family's config has them: one depth and head
    count (ViT), one per stage (Swin), or none of these (ResNet). Read off the fields, not the family name."""
    rows = []
    depth = config.get("depth", config.get("depths"))
    if None not in (config.get("embed_dim"), depth, config.get("num_heads")):
        if isinstance(depth, (list, tuple)):
            rows.append(("width / blocks / heads per stage",
                         f"{config['embed_dim']} / {_joined(depth)} / {_joined(config['num_heads'])}"))
        else:
            rows.append(("width/depth/heads", f"{config['embed_dim']}/{depth}/{config['num_heads']}"))
    if config.get("patch_size") is not None:
        window = config.get("window_size")
        rows.append(("patch / window", f"{config['patch_size']} / {window}") if window is not None
                    else ("patch", config["patch_size"]))
    return rows


def _joined(values) -> str:
    return ",".join(map(str, values))


def _short(values) -> str:
    return ",".join(f"{v:g}" for v in values)
