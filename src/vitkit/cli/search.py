"""`vitkit search INDEX QUERY...`: nearest images by image or by text (CLIP), or `--eval` retrieval measures."""
from __future__ import annotations

import sys

from .common import add_json, emit, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("search", help="top-k images of an index for query images or text; --eval for Recall@k/mAP")
    p.add_argument("index", help="an index folder written by `vitkit index`; several (comma-separated, or a "
                   "quoted glob such as 'idx-*'): the parts of one collection, searched together and merged by score")
    p.add_argument("queries", nargs="*", help="query image files")
    p.add_argument("--text", action="append", default=[], help="a text query (CLIP models; repeatable)")
    p.add_argument("-k", "--top-k", type=positive_int, default=10)
    p.add_argument("--model", help="the checkpoint to embed queries with (default: the one the index records)")
    p.add_argument("--nprobe", type=positive_int, help="override the index's stored IVF nprobe")
    p.add_argument("--ef-search", type=positive_int, help="override the index's stored HNSW efSearch")
    p.add_argument("--sheet", help="write a contact sheet PNG of the hits here")
    p.add_argument("--eval", metavar="EMB_DIR|self",
                   help="retrieval Recall@k, mAP, k-NN and ANN recall@10 of these embeddings as queries against the "
                        "index's collection (self, or the collection's own embeddings: leave-one-out; queries "
                        "partly in it never retrieve their own entry)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import ConfigError
    from ..retrieval.index import SearchIndex
    from ..retrieval.sharded import ShardedIndex, index_folders

    folders = index_folders(args.index)
    index = SearchIndex.load(folders[0]) if len(folders) == 1 else ShardedIndex.load(folders)
    if args.eval and len(folders) > 1:
        raise ConfigError("--eval scores one index against its own collection: give one index folder")
    if args.nprobe or args.ef_search:
        index.set_search_params(args.nprobe, args.ef_search)
        index.meta["params"] = index.meta.get("params", {}) | {k: v for k, v in (
            ("nprobe", args.nprobe), ("ef_search", args.ef_search)) if v}
    if args.eval:
        return _eval(args, index)
    if not args.queries and not args.text:
        raise ConfigError("give query images, --text \"...\", or --eval EMB_DIR")
    from ..retrieval.search import contact_sheet, embed_images, embed_texts, hits_json, load_index_model, score_labels

    model = load_index_model(index, args.model)
    ident = index.model_identity
    queries, results, errors = [], [], []
    if args.queries:
        vecs, ok, errors = embed_images(model, args.queries, ident["feature"], ident["normalized"])
        if len(ok):
            results += index.search(vecs, args.top_k)
            queries += [("image", p) for p in ok]
    if args.text:
        results += index.search(embed_texts(model, args.text, ident["feature"]), args.top_k)
        queries += [("text", t) for t in args.text]
    out = {"index": str(args.index), "parts": [str(f) for f in folders], "k": args.top_k, "params": index.meta.get("params", {}),
           "results": [{"query": q, "kind": kind, "hits": hits_json(h)} for (kind, q), h in zip(queries, results)],
           "errors": errors}
    if args.sheet and results:
        out["sheet"] = str(contact_sheet(queries, results, args.sheet, sources=index.sources()))

    def render(d):
        for r in d["results"]:
            scores = score_labels([h["score"] for h in r["hits"]], min_decimals=4)
            several = len(d["parts"]) > 1  # then each hit says which part it came from
            rows = [(i + 1, score, h["label"] if h["label"] is not None else "", h["path"])
                    + ((h["index"],) if several else ()) for i, (h, score) in enumerate(zip(r["hits"], scores))]
            print_table(f"{r['kind']}: {r['query']}", ["#", "score", "label", "path"] + ["index"] * several, rows,
                        justify=["right", "right", "left", "left"] + ["left"] * several)
        if d.get("sheet"):
            print(f"contact sheet: {d['sheet']}")

    emit(args, out, render)
    for e in errors:
        print(f"vitkit search: error: {e['error']}", file=sys.stderr)
    return 2 if errors else 0


def _eval(args, index) -> int:
    from ..retrieval.embed import Embeddings
    from ..retrieval.metrics import evaluate
    from ..retrieval.search import own_entries

    gallery = Embeddings(index.meta["embeddings"])
    note = None
    if args.eval == "self":
        res = evaluate(gallery.vectors, gallery.labels(), index=index)
    else:
        queries = Embeddings(args.eval)
        index.check_identity(queries.model_identity)
        # every query finding itself first would read as R@1 100%: its own entry is left out of its results
        same, own = own_entries(queries, gallery)
        if same:
            note = (f"note: {args.eval} is the index's own collection; scoring leave-one-out (each query's own "
                    "entry excluded)")
            res = evaluate(gallery.vectors, gallery.labels(), index=index)
        else:
            overlap = int((own >= 0).sum())
            if overlap:
                note = (f"note: {overlap} of {len(own)} queries in {args.eval} are items of the index's collection; "
                        "each one's own entry is excluded from its results")
            res = evaluate(queries.vectors, queries.labels(), gallery.vectors, gallery.labels(), exclude=own,
                           index=index)
    res = {"index": str(args.index), "queries_from": args.eval, "note": note} | res
    if note:  # on stderr, whatever the output format: --json stdout stays pure JSON
        print(note, file=sys.stderr)

    def render(d):
        rows = [(f"retrieval {k} (exact)", f"{v:.2f}%") for k, v in d["recall"].items()]
        rows += [(f"retrieval {k} (index)", f"{v:.2f}%") for k, v in d.get("index_recall", {}).items()]
        rows += [("mAP (exact, full ranking)", f"{d['mAP']:.2f}%"),
                 (f"k-NN top-1 (k={d['knn']['k']}, T={d['knn']['T']})", f"{d['knn']['top1']:.2f}%")]
        if "ann_recall" in d:
            (name, v), = [(k, v) for k, v in d["ann_recall"].items() if k.startswith("recall@")]
            rows.append((f"ANN {name} vs exact ({d['ann_recall']['kind']})", f"{v:.4f}"))
        how = ("(leave-one-out)" if d["leave_one_out"] else
               f"gallery ({d['own_entries_excluded']} own entries excluded)" if d["own_entries_excluded"] else "gallery")
        print_table(f"retrieval: {d['queries']} queries vs {d['gallery']} {how}", ["measure", "value"], rows)

    emit(args, res, render)
    return 0
