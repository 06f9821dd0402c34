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
    p.add_argument("--merge", type=int, default=None, metavar="R",
                   help="token merging (ToMe): R tokens merged per block; reports the tokens of each block")
    p.add_argument("--eager-attn", action="store_true",
                   help="activation memory for the eager attention path (keeps the [B, H, T, T] probabilities)")
    p.add_argument("--train-memory", action="store_true",
                   help="per-device training memory (weights, grads, AdamW, activations at --batch per device) "
                   "with DDP and with FSDP on --devices devices")
    p.add_argument("--devices", type=positive_int, default=8, help="devices for --train-memory (default 8)")
    p.add_argument("--vlm", action="store_true", help="what an image costs a language model in tokens: patch "
                   "tokens, a 2x2 merge / pixel shuffle, InternVL tiling and LLaVA-NeXT anyres (analysis/vlm.py)")
    p.add_argument("--image-size", type=img_size, metavar="HxW", help="with --vlm: the image the tiling schemes "
                   "cut (default: one tile at the model's input size)")
    p.add_argument("--max-tiles", type=positive_int, default=12, help="with --vlm: InternVL's tile limit (default 12)")
    add_json(p)
    p.set_defaults(func=run)


def _pct(part: int, total: int) -> str:
    return f"{100 * part / total:.1f}%" if total else "-"


def run(args) -> int:
    from ..analysis.cost import format_bytes, format_count, model_cost

    if args.vlm:
        return _run_vlm(args)

    merge = {} if args.merge is None else {"merge": args.merge}
    report = model_cost(args.model, img_size=args.img_size, batch=args.batch, dtype=args.dtype,
                        fused_attention=not args.eager_attn, **merge)
    if not hasattr(report, "tokens"):  # another family's closed form (Swin): its parts and stages
        emit(args, report.to_dict(), lambda _: _render_family(report))
        return 0

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
            *([(f"tokens per block, merging {r.merge} (ToMe)", " > ".join(map(str, r.tokens_per_block)))]
              if r.merge else []),
            ("layers x heads, width, MLP", f"{r.layers} x {r.heads}, {r.width}, {r.mlp_hidden}"),
            ("attention scores per head per layer (T^2)", f"{r.attn_scores_per_head_layer:,}"),
            ("attention scores per image (all heads, layers)", f"{r.attn_scores_per_image:,}"),
            ("GMACs per image (FLOPs = 2 x MACs)", f"{r.gmacs_per_image:.2f}"),
            (f"training activations ({r.dtype}, {attn} attention, batch {r.batch}"
             f"{', without merging' if r.merge else ''})", format_bytes(r.activation_bytes)),
            (f"weights ({r.dtype})", format_bytes(r.weight_bytes)),
            ("weights + grads + AdamW state (fp32)", format_bytes(r.train_state_bytes)),
        ], justify=("left", "right"))

    if not args.train_memory:
        emit(args, report.to_dict(), lambda _: render(report))
        return 0
    from dataclasses import asdict

    from ..analysis.cost import train_memory

    memory = train_memory(args.model, args.devices, batch=args.batch, dtype=args.dtype, img_size=args.img_size,
                          fused_attention=not args.eager_attn)

    def render_memory(_):
        render(report)
        rows = [(m.strategy.upper(), *(format_bytes(v) for v in (m.params, m.grads, m.optimizer, m.working,
                                                                  m.activations, m.total))) for m in memory]
        print_table(f"training memory per device: {args.devices} devices, batch {args.batch} per device, "
                    f"{report.dtype} activations", ["strategy", "weights", "grads", "AdamW", "working set",
                                                    "activations", "total"], rows)

    emit(args, report.to_dict() | {"train_memory": [asdict(m) for m in memory]}, render_memory)
    return 0


def _render_family(r) -> None:
    """A non-ViT family's cost: parameters and MACs by part, then its per-stage figures (Swin: tokens, windows,
    window attention scores against what global attention over the same tokens would need)."""
    from ..analysis.cost import format_bytes, format_count

    pt, mt = r.params_total, r.macs_total
    parts = list(dict.fromkeys([*r.params, *r.macs]))
    table = [(part.replace("_", " "), f"{r.params[part]:,}" if part in r.params else "-",
              _pct(r.params[part], pt) if part in r.params else "-",
              format_count(r.macs[part]) if part in r.macs else "-", _pct(r.macs[part], mt) if part in r.macs else "-")
             for part in parts]
    table.append(("total", f"{pt:,}", "100%", format_count(mt), "100%"))
    h, w = r.img_size
    print_table(f"{r.name} ({r.family}) at {h}x{w}, batch {r.batch}", ["part", "params", "% params", "MACs",
                "% MACs"], table)
    st = r.stages
    if st.get("tokens"):
        rows = []
        for stage in st["tokens"]:
            local, full = st["attn_scores"][stage], st["global_attn_scores"][stage]
            rows.append((stage, f"{st['tokens'][stage]:,}", f"{st['windows'][stage]:,}", f"{local:,}", f"{full:,}",
                         f"{full / local:.1f}x"))
        local, full = sum(st["attn_scores"].values()), sum(st["global_attn_scores"].values())
        rows.append(("all", f"{sum(st['tokens'].values()):,}", f"{sum(st['windows'].values()):,}", f"{local:,}",
                     f"{full:,}", f"{full / local:.1f}x"))
        print_table("attention scores per image (all blocks and heads): windows vs global attention",
                    ["stage", "tokens", "windows", "window scores", "global scores", "global / window"], rows)
    print_table(None, ["figure", "value"], [
        ("GMACs per image (FLOPs = 2 x MACs)", f"{r.gmacs_per_image:.2f}"),
        (f"weights ({r.dtype})", format_bytes(r.weight_bytes)),
        ("weights + grads + AdamW state (fp32)", format_bytes(r.train_state_bytes)),
    ], justify=("left", "right"))


def _run_vlm(args) -> int:
    from ..analysis.vlm import vlm_report

    image = args.image_size if isinstance(args.image_size, tuple) or args.image_size is None else \
        (args.image_size, args.image_size)
    report = vlm_report(args.model, img_size=args.img_size, image_hw=image, max_tiles=args.max_tiles)

    def render(r):
        h, w = r["image_size"]
        rows = [(s["scheme"], s["example"], str(s["tiles"]), f"{s['tokens_per_tile']:,}", f"{s['tokens']:,}",
                 str(s["token_width"])) for s in r["schemes"]]
        print_table(f"{r['model']}: an image of {h}x{w} px as LLM tokens (patch {r['patch_size']}, grid "
                    f"{r['grid'][0]}x{r['grid'][1]} per {r['img_size'][0]}x{r['img_size'][1]} tile)",
                    ["scheme", "counted as in", "tiles", "tokens / tile", "LLM tokens", "token width"], rows)

    emit(args, report, render)
    return 0
