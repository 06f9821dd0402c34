"""`vitkit dedup EMB_DIR --threshold T`: groups of near-duplicate images (cosine similarity >= T)."""
from __future__ import annotations

import sys

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
    from ..retrieval.search import score_labels

    res = dedup(args.embeddings, args.threshold)

    def render(d):
        shown = d["groups"][: args.max_groups]
        links = score_labels([g["min_link_similarity"] for g in shown], min_decimals=4)
        rows = [(len(g["rows"]), link, "\n".join(g["paths"])) for g, link in zip(shown, links)]
        print_table(f"{len(d['groups'])} near-duplicate group(s), {d['duplicates']} redundant image(s) of {d['count']} "
                    f"at cosine >= {d['threshold']}", ["size", "min link", "paths"], rows,
                    justify=["right", "right", "left"])
        nearest = d["nearest_neighbour_similarity"]
        if nearest:  # what the threshold is up against in this collection, for this model
            median, p99 = score_labels([nearest["median"], nearest["p99"]])
            print(f"nearest-neighbour similarity: median {median}, p99 {p99} ({nearest['images']} images)")

    emit(args, res, render)
    if res["warning"]:  # one line on stderr, whatever the output format
        print(res["warning"], file=sys.stderr)
    return 0
