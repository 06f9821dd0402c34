"""`vitkit index EMB_DIR --out INDEX [--max-memory 2GB]`: a FAISS index over embeddings, chosen within a memory
budget, with its recall@10 measured; `vitkit index INDEX --add EMB_DIR` / `--remove IDS|FILE` change it in place."""
from __future__ import annotations

import sys

from .common import add_json, emit, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("index", help="build a FAISS index over `vitkit embed` output (cosine), or add to / remove "
                                     "from one")
    p.add_argument("embeddings", help="an EMB_DIR written by `vitkit embed` (with --add/--remove: an INDEX folder)")
    p.add_argument("--out", help="index folder to build: index.faiss, index.json, manifest.jsonl")
    change = p.add_mutually_exclusive_group()
    change.add_argument("--add", metavar="EMB_DIR", help="append these embeddings (same model) to the INDEX; "
                                                         "existing vectors keep their ids")
    change.add_argument("--remove", metavar="IDS|FILE", help="delete ids ('3,17,42') or those a file lists "
                                                            "(ids or source paths, one a line; .jsonl/.csv manifests)")
    p.add_argument("--kind", default="auto", choices=["auto", "flat", "ivf", "hnsw", "ivfpq"],
                   help="auto: flat below 100k vectors, else HNSW, IVF, IVF-PQ + re-ranking, IVF-PQ: the first that "
                        "fits --max-memory")
    p.add_argument("--max-memory", help="memory budget of the index, e.g. 512MB, 2GB, 1.5GiB (auto assumes 16GiB)")
    p.add_argument("--rerank", default="auto", choices=["auto", "none", "fp16", "fp32"],
                   help="IVF-PQ re-ranking on stored vectors (auto: float16 when they fit the budget)")
    p.add_argument("--recall-queries", type=int, default=1000,
                   help="held-out collection rows to measure recall@10 against exact search with (0: skip)")
    p.add_argument("--nlist", type=positive_int, help="IVF lists (default 4*sqrt(N), at most N/39)")
    p.add_argument("--nprobe", type=positive_int, help="IVF lists searched, stored with the index (default nlist/16, >= 8)")
    p.add_argument("--ef-search", type=positive_int, help="HNSW candidates per query, stored (default 256)")
    p.add_argument("--hnsw-m", type=positive_int, help="HNSW links per node (default: up to 32, as the budget allows)")
    p.add_argument("--pq-m", type=positive_int, help="IVF-PQ bytes per vector (must divide the width; default D/8)")
    p.add_argument("--overwrite", action="store_true")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import ConfigError
    from ..retrieval.budget import format_memory
    from ..retrieval.index import add_to_index, build_index, remove_from_index

    if args.add or args.remove:
        if args.out:
            raise ConfigError("--add/--remove change the INDEX given in place: drop --out")
        meta = (add_to_index(args.embeddings, args.add) if args.add else remove_from_index(args.embeddings, args.remove))
        meta = meta | {"out": str(args.embeddings)}
    else:
        if not args.out:
            raise ConfigError("give --out INDEX to build an index, or --add EMB_DIR / --remove IDS to change one")
        meta = build_index(args.embeddings, args.out, args.kind, nlist=args.nlist, pq_m=args.pq_m, hnsw_m=args.hnsw_m,
                           nprobe=args.nprobe, ef_search=args.ef_search, max_memory=args.max_memory,
                           rerank=args.rerank, recall_queries=args.recall_queries, overwrite=args.overwrite)
        meta = meta | {"out": str(args.out)}

    def render(d):
        params = ", ".join(f"{k}={v}" for k, v in d["params"].items()) or "-"
        recall = d.get("recall_at_10")
        budget = d.get("max_memory_bytes")
        print_table(f"index ({d['out']})", ["kind", "factory", "vectors", "dim", "search params", "memory (est.)",
                                            "file", "budget", "recall@10", "build s"],
                    [(d["kind"], d["factory"], d["count"], d["dim"], params, format_memory(d["estimated_bytes"]),
                      format_memory(d["index_bytes"]), format_memory(budget) if budget else "-",
                      f"{recall['recall']:.4f} ({recall['queries']} q)" if recall else "-", d["build_seconds"])])
        change = d.get("change")
        if change and "added" in change:
            print(f"added {change['added']:,} vectors as ids {change['first_id']}..{change['last_id']}")
        elif change:
            print(f"removed {change['removed']:,} vectors")
        else:
            print(f"choice: {d['choice']}")

    emit(args, meta, render)
    if meta.get("over_budget"):
        print(f"vitkit index: note: the index now takes ~{format_memory(meta['estimated_bytes'])}, over its build "
              f"budget of {format_memory(meta['max_memory_bytes'])}: rebuild it to choose again", file=sys.stderr)
    return 0
