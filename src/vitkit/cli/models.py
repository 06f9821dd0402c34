"""`vitkit models [PATTERN]`: the registry with sizes and costs (computed from configs; nothing is built)."""
from __future__ import annotations

from .common import add_json, emit


def register(sub) -> None:
    p = sub.add_parser("models", help="list registered models with params, GMACs and pretrained tags")
    p.add_argument("pattern", nargs="?", help="substring or shell wildcard, e.g. deit or 'vit_*_patch16_224'")
    p.add_argument("--refused", action="store_true",
                   help="timm names vitkit refuses on purpose, with the reason (docs/catalogue.md)")
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


def refused_rows(pattern: str | None = None) -> list[dict]:
    """The refusal table: timm name patterns vitkit does not build, each with its reason."""
    import fnmatch

    from ..models.vit_catalogue import REFUSED

    pat = pattern if not pattern or any(c in pattern for c in "*?[") else f"*{pattern}*"
    return [{"pattern": p, "reason": why} for p, why in REFUSED.items()
            if not pat or fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p.replace("*", ""), pat)]


def run(args) -> int:
    if args.refused:
        def render_refused(rows):
            from rich.table import Table

            from .common import console

            table = Table(title=f"{len(rows)} refused name patterns")
            table.add_column("timm names", overflow="fold")
            table.add_column("why vitkit does not build them", overflow="fold")
            for r in rows:
                table.add_row(r["pattern"], r["reason"])
            console().print(table)

        emit(args, refused_rows(args.pattern), render_refused)
        return 0
    rows = model_rows(args.pattern)

    def render(rows):
        from rich import box
        from rich.table import Table

        from .common import console

        con = console()
        wide = con.width >= 130  # every column; narrower terminals get the compact table, which fits 80
        table = Table(title=f"{len(rows)} models", box=box.SIMPLE_HEAD if not wide else box.HEAVY_HEAD,
                      pad_edge=wide, collapse_padding=not wide)
        cols = ([("name", "left"), ("family", "left"), ("group", "left"), ("params (M)", "right"), ("GMACs", "right"),
                 ("res", "right"), ("patch", "right"), ("width/depth/heads", "right"), ("pretrained", "left")] if wide
                else [("name (pretrained tags below)", "left"), ("Mparams", "right"), ("GMACs", "right"),
                      ("res/patch", "right"), ("w/d/h", "right"), ("group", "left")])
        for col, justify in cols:
            folds = col in ("group", "family", "pretrained") or col.startswith("name (")  # numbers never break
            longest = max(len(r["name"]) for r in rows) if col.startswith("name") else None
            table.add_column(col, justify=justify, overflow="fold", no_wrap=not folds, min_width=longest)
        for r in rows:
            h, w = r["img_size"]
            res = str(h) if h == w else f"{h}x{w}"
            shape = f"{r['embed_dim']}/{r['depth']}/{r['num_heads']}" if "embed_dim" in r else "-"
            gmacs = "-" if r["gmacs"] is None else f"{r['gmacs']:.2f}"
            if wide:
                table.add_row(r["name"], r["family"], r["group"], f"{r['params_m']:.2f}", gmacs, res,
                              str(r.get("patch_size", "-")), shape, ", ".join(r["pretrained"]) or "-")
            else:
                name = r["name"] + "".join(f"\n  .{t}" for t in r["pretrained"])
                table.add_row(name, f"{r['params_m']:.1f}", gmacs, f"{res}/{r.get('patch_size', '-')}", shape,
                              r["group"] or r["family"])  # every registered name has a listing group
        con.print(table)

    emit(args, rows, render)
    return 0
