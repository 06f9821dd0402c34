"""Indexes chosen by a memory budget (`vitkit index --max-memory`), on synthetic clustered vectors: for each
budget the kind `auto` picks, its estimated and serialized memory, build time, recall@10 against exact search on
held-out collection rows (each query's own row left out) and queries/s on fresh queries. An IVF-PQ index with
re-ranking is also searched through its PQ index alone (the same codes, no stored vectors): the re-ranking gain.

The data is benchmarks/ann.py's mixture (clusters of low intrinsic dimension on the unit sphere, like image
features). Past --in-memory-below vectors the collection is written to a float16 memory map (--store DIR) in
chunks and the index is built from the map, as `vitkit index` builds from an EMB_DIR: 10M x 384 float32 vectors
(15 GB) beside a 8 GB index do not fit a 24 GB machine. Peak RSS is reported after each build.
Usage: python benchmarks/index_budget.py [--n 1000000] [--dim 384] [--budgets 4GB,1.7GB,1GB,200MB]
[--queries 1000] [--name NAME]. Writes benchmarks/results/index_budget-N.{md,json} (or NAME.{md,json}).
"""
from __future__ import annotations

import argparse
import datetime
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann import mixture  # noqa: E402  (the same synthetic data as the ANN benchmark)

from vitkit.bench import machine_info  # noqa: E402
from vitkit.retrieval.budget import estimate_bytes, format_memory  # noqa: E402
from vitkit.retrieval.index import build_faiss, measure_recall, unwrapped  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def serialized_bytes(index) -> int:
    import faiss

    with tempfile.NamedTemporaryFile(suffix=".faiss") as f:
        faiss.write_index(index, f.name)
        return Path(f.name).stat().st_size


def queries_per_second(index, queries: np.ndarray, k: int = 10) -> float:
    index.search(queries[:10], k)  # warm-up
    t0 = time.perf_counter()
    index.search(queries, k)
    return len(queries) / (time.perf_counter() - t0)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def one(vecs: np.ndarray, fresh: np.ndarray, label: str, **build) -> list[dict]:
    import faiss

    index, plan, factory, params, times, pick = build_faiss(vecs, **build)
    recall = measure_recall(index, vecs, held_out_from=pick, queries=len(fresh))
    row = {"setting": label, "kind": plan.kind, "factory": factory, "choice": plan.reason,
           "estimated_bytes": plan.estimated_bytes, "serialized_bytes": serialized_bytes(index),
           "build_s": round(times["build"], 1), "train_s": round(times["train"], 1),
           "recall_at_10": recall["recall"] if recall else None, "qps": round(queries_per_second(index, fresh)),
           "peak_rss_bytes": peak_rss_bytes()}
    rows = [row]
    core = unwrapped(index)
    if isinstance(core, faiss.IndexRefine):  # the same PQ codes searched without the stored vectors
        base = faiss.downcast_index(core.base_index)  # ids = build order = the IDMap's ids (nothing was removed)
        alone = measure_recall(base, vecs, held_out_from=pick, queries=len(fresh))
        n, dim = vecs.shape
        rows.append(row | {"setting": f"{label}, PQ codes alone (no re-ranking)",
                           "factory": factory.split(",Refine")[0].removeprefix("IDMap,"),
                           "estimated_bytes": estimate_bytes("ivfpq", n, dim, nlist=params["nlist"], pq_m=params["pq_m"]),
                           "serialized_bytes": serialized_bytes(base), "recall_at_10": alone["recall"],
                           "qps": round(queries_per_second(base, fresh))})
    for r in rows:
        print(json.dumps(r), flush=True)
    return rows


def collection(n: int, dim: int, centres, bases, rng, store: Path | None, chunk: int = 250_000) -> np.ndarray:
    """The n x dim mixture, in memory or (store given) in a float16 memory map written chunk by chunk."""
    if store is None:
        return mixture(n, dim, centres, bases, 1.0, 0.1, rng)
    store.mkdir(parents=True, exist_ok=True)
    vecs = np.lib.format.open_memmap(store / f"mixture-{n}x{dim}.npy", mode="w+", dtype=np.float16, shape=(n, dim))
    for i in range(0, n, chunk):
        vecs[i:i + chunk] = mixture(min(chunk, n - i), dim, centres, bases, 1.0, 0.1, rng)
    vecs.flush()
    return np.load(store / f"mixture-{n}x{dim}.npy", mmap_mode="r")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--budgets", default="4GB,1.7GB,1GB,200MB")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--in-memory-below", type=int, default=2_000_000)
    ap.add_argument("--store", default=None, help="folder for the float16 memory map (default: a temporary one)")
    ap.add_argument("--name", default=None, help="results file name (default: index_budget-N)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((max(16, args.n // 1000), args.dim), np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    bases = rng.standard_normal((len(centres), args.dim, 16), np.float32) / args.dim ** 0.5
    with tempfile.TemporaryDirectory() as tmp:
        store = None if args.n < args.in_memory_below else Path(args.store or tmp)
        t0 = time.perf_counter()
        vecs = collection(args.n, args.dim, centres, bases, rng, store)
        made_s = time.perf_counter() - t0
        fresh = mixture(args.queries, args.dim, centres, bases, 1.0, 0.1, rng)
        rows = [r for b in args.budgets.split(",") for r in one(vecs, fresh, f"auto, --max-memory {b}", max_memory=b)]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    info = {"n": args.n, "dim": args.dim, "queries": args.queries, "date": stamp, "machine": machine_info(),
            "command": "python " + " ".join(sys.argv), "collection": "float16 memory map" if store else "in memory",
            "collection_seconds": round(made_s, 1), "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    name = args.name or f"index_budget-{args.n}"
    (RESULTS / f"{name}.json").write_text(json.dumps(info, indent=1))
    lines = [f"{args.n:,} x {args.dim} vectors ({info['collection']}), {stamp}", "",
             "| setting | kind (factory) | memory est. / file | build s (train) | peak RSS so far | recall@10 | queries/s |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['kind']} (`{r['factory']}`) | {format_memory(r['estimated_bytes'])} / "
              f"{format_memory(r['serialized_bytes'])} | {r['build_s']} ({r['train_s']}) | "
              f"{format_memory(r['peak_rss_bytes'])} | {r['recall_at_10']} | {r['qps']:,} |" for r in rows]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
