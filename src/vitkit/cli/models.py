"""`vitkit models [PATTERN]`: the registry with sizes and costs (computed from configs; nothing is built)."""
from __future__ import annotations

from .common import add_json, emit


def register(sub) -> None:
    p = sub.add_parser("models", help="list registered models with params, GMACs and pretrained tags")
    p.add_argument("pattern", nargs="?", help="substring or shell wildcard, e.g. deit or 'vit_*_patch16_224'")
    add_json(p)
    p.set_defaults(func=run)


def model_rows(pattern: str | None = None) -> list[dict]:
    from ..analysis.cost import model_summary
    from ..errors import ConfigError
    from ..models import list_models

    names = list_models(pattern)
    if not names:
        raise ConfigError(f"no registered model matches {pattern!r} (run `vitkit models` for the full list)")
    return [model_summary(name) for name in names]


def run(args) -> int:
    rows = model_rows(args.pattern)

    def render(rows):
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(rows)} models")
        for col, justify in (("name", "left"), ("family", "left"), ("group", "left"), ("params (M)", "right"),
                             ("GMACs", "right"),
                             ("res", "right"), ("patch", "right"), ("width/depth/heads", "right"),
                             ("pretrained", "left")):
            table.add_column(col, justify=justify, no_wrap=col in ("name", "family"))
        for r in rows:
            h, w = r["img_size"]
            shape = f"{r['embed_dim']}/{r['depth']}/{r['num_heads']}" if "embed_dim" in r else "-"
            table.add_row(r["name"], r["family"], r["group"], f"{r['params_m']:.2f}",
                          "-" if r["gmacs"] is None else f"{r['gmacs']:.2f}", str(h) if h == w else f"{h}x{w}",
                          str(r.get("patch_size", "-")), shape, ", ".join(r["pretrained"]) or "-")
        Console(width=max(140, Console().width)).print(table)

    emit(args, rows, render)
    return 0
