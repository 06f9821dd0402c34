"""`vitkit cost MODEL`: parameters, MACs, tokens and training activation memory, from the config alone."""
from __future__ import annotations

from .common import add_json, emit, img_size, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("cost", help="parameters, MACs, tokens and activation memory of a model (no weights needed)")
    p.add_argument("model", help="registered name (see `vitkit models`), a variant like B/16 or S/14@518, "
                   "or a checkpoint file / HF folder")
    p.add_argument("--img-size", type=img_size, help="input resolution: 224 or HxW (default: the model's)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size for MACs and activations (default 1)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="element size for activation and weight memory (default fp32)")
    p.add_argument("--eager-attn", action="store_true",
                   help="activation memory for the eager attention path (keeps the [B, H, T, T] probabilities)")
    add_json(p)
    p.set_defaults(func=run)


def _pct(part: int, total: int) -> str:
    return f"{100 * part / total:.1f}%" if total else "-"


def run(args) -> int:
    from ..analysis.cost import format_bytes, format_count, model_cost

    report = model_cost(args.model, img_size=args.img_size, batch=args.batch, dtype=args.dtype,
                        fused_attention=not args.eager_attn)

    def render(r):
        P, M = r.params, r.macs
        pt, mt = r.params_total, r.macs_total
        rows = [  # (part, params or None, MACs or None)
            ("patch embedding", P["patch_embed"], M["patch_embed"]),
            ("attention projections (qkv, proj)", P["attention"], M["attn_proj"]),
            ("attention scores (QK^T, AV)", None, M["attn_scores"]),
            ("MLP", P["mlp"], M["mlp"]),
            ("LayerNorms", P["norms"], None),
            ("position table + prefix tokens", P["pos_prefix"], None),
            ("head", P["head"], M["head"]),
        ]
        table = [(name, "-" if p is None else f"{p:,}", "-" if p is None else _pct(p, pt),
                  "-" if m is None else format_count(m), "-" if m is None else _pct(m, mt)) for name, p, m in rows]
        table.append(("total", f"{pt:,}", "100%", format_count(mt), "100%"))
        h, w = r.img_size
        print_table(f"{r.name} at {h}x{w}, batch {r.batch}", ["part", "params", "% params",
                    "MACs", "% MACs"], table)
        attn = "eager" if not r.fused_attention else "fused"
        print_table(None, ["figure", "value"], [
            ("patch / grid / patches", f"{r.patch_size} / {r.grid[0]}x{r.grid[1]} / {r.patches}"),
            ("tokens (prefix + patches)", f"{r.tokens} ({r.prefix_tokens} + {r.patches})"),
            ("layers x heads, width, MLP", f"{r.layers} x {r.heads}, {r.width}, {r.mlp_hidden}"),
            ("attention scores per head per layer (T^2)", f"{r.attn_scores_per_head_layer:,}"),
            ("attention scores per image (all heads, layers)", f"{r.attn_scores_per_image:,}"),
            ("GMACs per image (FLOPs = 2 x MACs)", f"{r.gmacs_per_image:.2f}"),
            (f"training activations ({r.dtype}, {attn} attention, batch {r.batch})", format_bytes(r.activation_bytes)),
            (f"weights ({r.dtype})", format_bytes(r.weight_bytes)),
            ("weights + grads + AdamW state (fp32)", format_bytes(r.train_state_bytes)),
        ], justify=("left", "right"))

    emit(args, report.to_dict(), lambda _: render(report))
    return 0
