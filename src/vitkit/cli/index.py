"""`vitkit index EMB_DIR --out INDEX`: a FAISS index (flat, ivf, hnsw, ivfpq, or chosen by size) over embeddings."""
from __future__ import annotations

from .common import add_json, emit, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("index", help="build a FAISS index over `vitkit embed` output (cosine)")
    p.add_argument("embeddings", help="an EMB_DIR written by `vitkit embed`")
    p.add_argument("--out", required=True, help="index folder: index.faiss, index.json, manifest.jsonl")
    p.add_argument("--kind", default="auto", choices=["auto", "flat", "ivf", "hnsw", "ivfpq"],
                   help="auto: flat below 100k vectors, hnsw while it fits --max-memory, ivfpq beyond")
    p.add_argument("--max-memory", type=float, default=16.0, help="GB the auto choice may give an hnsw index")
    p.add_argument("--nlist", type=positive_int, help="IVF lists (default 4*sqrt(N), at most N/39)")
    p.add_argument("--nprobe", type=positive_int, help="IVF lists searched, stored with the index (default nlist/16, >= 8)")
    p.add_argument("--ef-search", type=positive_int, help="HNSW candidates per query, stored (default 64)")
    p.add_argument("--hnsw-m", type=positive_int, default=32, help="HNSW links per node")
    p.add_argument("--pq-m", type=positive_int, help="IVF-PQ bytes per vector (must divide the width; default D/8)")
    p.add_argument("--overwrite", action="store_true")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..retrieval.index import build_index

    meta = build_index(args.embeddings, args.out, args.kind, nlist=args.nlist, pq_m=args.pq_m, hnsw_m=args.hnsw_m,
                       nprobe=args.nprobe, ef_search=args.ef_search, memory_gb=args.max_memory,
                       overwrite=args.overwrite)
    meta = meta | {"out": str(args.out)}

    def render(d):
        params = ", ".join(f"{k}={v}" for k, v in d["params"].items()) or "-"
        print_table(f"index ({d['out']})", ["kind", "factory", "vectors", "dim", "search params", "build s", "MB"],
                    [(d["kind"], d["factory"], d["count"], d["dim"], params, d["build_seconds"],
                      f"{d['index_bytes'] / 2**20:.1f}")])

    emit(args, meta, render)
    return 0
