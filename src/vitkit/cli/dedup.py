"""`vitkit dedup EMB_DIR --threshold T`: groups of near-duplicate images (cosine similarity >= T)."""
from __future__ import annotations

from .common import add_json, emit, print_table


def register(sub) -> None:
    p = sub.add_parser("dedup", help="near-duplicate groups of an embedded collection")
    p.add_argument("embeddings", help="an EMB_DIR written by `vitkit embed`")
    p.add_argument("--threshold", type=float, default=0.95, help="cosine similarity that links two images")
    p.add_argument("--max-groups", type=int, default=50, help="groups shown in the table (--json lists all)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..retrieval.dedup import dedup

    res = dedup(args.embeddings, args.threshold)

    def render(d):
        rows = [(len(g["rows"]), f"{g['min_link_similarity']:.4f}", "\n".join(g["paths"]))
                for g in d["groups"][: args.max_groups]]
        print_table(f"{len(d['groups'])} near-duplicate group(s), {d['duplicates']} redundant image(s) of {d['count']} "
                    f"at cosine >= {d['threshold']}", ["size", "min link", "paths"], rows,
                    justify=["right", "right", "left"])

    emit(args, res, render)
    return 0
