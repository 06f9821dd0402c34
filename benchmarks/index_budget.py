"""Indexes chosen by a memory budget (`vitkit index --max-memory`), on synthetic clustered vectors: for each
budget the kind `auto` picks, its estimated and serialized memory, build time, recall@10 against exact search on
held-out collection rows (each query's own row left out) and queries/s on fresh queries; then IVF-PQ with and
without float16 re-ranking at the same code size (the re-ranking gain).

The data is benchmarks/ann.py's mixture (clusters of low intrinsic dimension on the unit sphere, like image
features). Usage: python benchmarks/index_budget.py [--n 1000000] [--dim 384] [--budgets 4GB,1.7GB,1GB,200MB]
[--queries 1000]. Writes benchmarks/results/index_budget-N.{md,json}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann import mixture  # noqa: E402  (the same synthetic data as the ANN benchmark)

from vitkit.bench import machine_info  # noqa: E402
from vitkit.retrieval.budget import format_memory  # noqa: E402
from vitkit.retrieval.index import build_faiss, measure_recall  # noqa: E402

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


def one(vecs: np.ndarray, fresh: np.ndarray, label: str, **build) -> dict:
    index, plan, factory, params, times, pick = build_faiss(vecs, **build)
    recall = measure_recall(index, vecs, held_out_from=pick, queries=len(fresh))
    row = {"setting": label, "kind": plan.kind, "factory": factory, "choice": plan.reason,
           "estimated_bytes": plan.estimated_bytes, "serialized_bytes": serialized_bytes(index),
           "build_s": round(times["build"], 1), "recall_at_10": recall["recall"] if recall else None,
           "qps": round(queries_per_second(index, fresh))}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--budgets", default="4GB,1.7GB,1GB,200MB")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((max(16, args.n // 1000), args.dim), np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    bases = rng.standard_normal((len(centres), args.dim, 16), np.float32) / args.dim ** 0.5
    vecs = mixture(args.n, args.dim, centres, bases, 1.0, 0.1, rng)
    fresh = mixture(args.queries, args.dim, centres, bases, 1.0, 0.1, rng)
    rows = [one(vecs, fresh, f"auto, --max-memory {b}", max_memory=b) for b in args.budgets.split(",")]
    rows += [one(vecs, fresh, f"ivfpq, rerank {r}", kind="ivfpq", rerank=r) for r in ("none", "fp16")]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    info = {"n": args.n, "dim": args.dim, "queries": args.queries, "date": stamp, "machine": machine_info(),
            "command": "python " + " ".join(sys.argv), "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"index_budget-{args.n}.json").write_text(json.dumps(info, indent=1))
    lines = [f"{args.n:,} x {args.dim} vectors, {stamp}", "",
             "| setting | kind (factory) | memory est. / file | build s | recall@10 | queries/s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['kind']} (`{r['factory']}`) | {format_memory(r['estimated_bytes'])} / "
              f"{format_memory(r['serialized_bytes'])} | {r['build_s']} | {r['recall_at_10']} | {r['qps']:,} |"
              for r in rows]
    (RESULTS / f"index_budget-{args.n}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
