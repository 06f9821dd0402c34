"""`vitkit convert SRC OUT.safetensors`: any supported checkpoint -> vitkit safetensors with metadata."""
from __future__ import annotations

from .common import add_json, emit, print_table


def register(sub) -> None:
    p = sub.add_parser("convert", help="import a checkpoint (timm, HF, JAX npz, DeiT/MAE/DINO/DINOv2, CLIP) "
                       "into vitkit safetensors")
    p.add_argument("src", help="checkpoint file or HF model folder")
    p.add_argument("out", help="output .safetensors path")
    p.add_argument("--model", help="registered architecture to load into (default: read it off the weights)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..api import load_model, save_model

    model = load_model(args.src, model_name=args.model)
    out = save_model(model, args.out, provenance={"converted_from": str(args.src)})
    cfg = model.cfg
    info = {
        "out": str(out),
        "layout": model.provenance.get("imported_from"),
        "family": model.family,
        "params": sum(p.numel() for p in model.parameters()),
        "config": cfg.to_dict(),
    }

    def render(d):
        rows = [("layout", d["layout"]), ("family", d["family"]), ("params", f"{d['params']:,}")]
        if d["family"] == "vit":
            rows += [("width/depth/heads", f"{cfg.embed_dim}/{cfg.depth}/{cfg.num_heads}"),
                     ("patch", cfg.patch_size)]
        rows += [("img", f"{cfg.img_size[0]}x{cfg.img_size[1]}"), ("classes", cfg.num_classes), ("written", d["out"])]
        print_table(f"converted {args.src}", ["field", "value"], rows)

    emit(args, info, render)
    return 0
