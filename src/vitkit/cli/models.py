"""`vitkit models [PATTERN]`: the registry with sizes and costs (computed from configs; nothing is built)."""
from __future__ import annotations

from .common import add_json, emit


def register(sub) -> None:
    p = sub.add_parser("models", help="list registered models with params, GMACs and pretrained tags")
    p.add_argument("pattern", nargs="?", help="substring or shell wildcard, e.g. deit or 'vit_*_patch16_224'")
    add_json(p)
    p.set_defaults(func=run)


def model_rows(pattern: str | None = None) -> list[dict]:
    from ..analysis.cost import model_cost
    from ..errors import ConfigError
    from ..models.registry import get_entry, list_models

    names = list_models(pattern)
    if not names:
        raise ConfigError(f"no registered model matches {pattern!r} (run `vitkit models` for the full list)")
    rows = []
    for name in names:
        entry, r = get_entry(name), model_cost(name)
        cfg = entry.cfg
        rows.append({
            "name": name, "family": entry.family, "params": r.params_total,
            "params_m": round(r.params_total / 1e6, 2), "gmacs": round(r.gmacs_per_image, 2),
            "img_size": list(cfg.img_size), "patch_size": cfg.patch_size, "embed_dim": cfg.embed_dim,
            "depth": cfg.depth, "num_heads": cfg.num_heads, "num_classes": cfg.num_classes,
            "tokens": r.tokens, "pretrained": sorted(entry.hub), "notes": entry.notes,
        })
    return rows


def run(args) -> int:
    rows = model_rows(args.pattern)

    def render(rows):
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(rows)} models")
        for col, justify in (("name", "left"), ("family", "left"), ("params (M)", "right"), ("GMACs", "right"),
                             ("res", "right"), ("patch", "right"), ("width/depth/heads", "right"),
                             ("pretrained", "left")):
            table.add_column(col, justify=justify, no_wrap=col in ("name", "family"))
        for r in rows:
            h, w = r["img_size"]
            table.add_row(r["name"], r["family"], f"{r['params_m']:.2f}", f"{r['gmacs']:.2f}",
                          str(h) if h == w else f"{h}x{w}", str(r["patch_size"]),
                          f"{r['embed_dim']}/{r['depth']}/{r['num_heads']}", ", ".join(r["pretrained"]) or "-")
        Console(width=max(140, Console().width)).print(table)

    emit(args, rows, render)
    return 0
