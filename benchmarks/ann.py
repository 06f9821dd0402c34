"""FAISS indexes as `vitkit index` builds them, on synthetic clustered vectors: build time, size, queries/s and
ANN recall@10 against exact search, for flat / ivf / hnsw / ivfpq at each width.

The data: clusters of low intrinsic dimension on the unit sphere, as image features are. C = max(16, N // 1000)
centres drawn from N(0, I_D) and normalised; each cluster k has its own random r-dimensional subspace B_k
(r = 16, a [D, r] Gaussian matrix with N(0, 1/D) entries); a vector is c_k + sigma * B_k z / sqrt(r) with
z ~ N(0, I_r) (sigma 1: the spread is as long as the centre) plus isotropic noise of length 0.1, then
L2-normalised; clusters are picked uniformly. Queries are fresh draws from the same mixture (not in the
database). Isotropic full-rank noise would be the wrong test: its nearest neighbours are all nearly equally far,
and PQ/IVF recall on such structureless data says nothing about real features (faiss PR #5254).

ANN recall@10 = |ANN top-10 ∩ exact top-10| / 10, averaged over the queries (vitkit.retrieval.metrics.ann_recall);
exact = the flat index. Each kind runs with the parameters vitkit stores (nprobe = max(8, nlist/16),
efSearch 256) and, with --sweep, also FAISS's defaults (nprobe 1, efSearch 16) and 4x vitkit's.

Usage: python benchmarks/ann.py [--n 1000000] [--dims 384,768] [--queries 1000] [--threads T] [--sweep]
Writes benchmarks/results/ann-N.{md,json}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vitkit.bench import machine_info
from vitkit.retrieval.index import DEFAULT_EF_SEARCH, build_faiss, set_search_params
from vitkit.retrieval.metrics import ann_recall

RESULTS = Path(__file__).resolve().parent / "results"


def mixture(n: int, dim: int, centres: np.ndarray, bases: np.ndarray, sigma: float, noise: float,
            rng: np.random.Generator) -> np.ndarray:
    """[n, dim] float32 unit vectors: a random centre each, plus a point of that centre's r-dimensional subspace
    (length ~sigma) and a little isotropic noise (length ~noise)."""
    c, r = len(centres), bases.shape[2]
    which = rng.integers(0, c, n)
    out = np.empty((n, dim), np.float32)
    for k in range(c):
        rows = np.flatnonzero(which == k)
        z = rng.standard_normal((len(rows), r), np.float32)
        x = centres[k] + (z @ bases[k].T) * (sigma / r ** 0.5)  # [m, dim]
        x += rng.standard_normal(x.shape, np.float32) * (noise / dim ** 0.5)
        out[rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def index_bytes(index) -> int:
    import faiss

    with tempfile.NamedTemporaryFile(suffix=".faiss") as f:
        faiss.write_index(index, f.name)
        return os.path.getsize(f.name)


def timed_search(index, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    index.search(q[:10], k)  # warm-up
    t0 = time.perf_counter()
    _, ids = index.search(q, k)
    return ids, len(q) / (time.perf_counter() - t0)


def run_dim(n: int, dim: int, n_queries: int, sigma: float, noise: float, intrinsic: int, kinds: list[str],
            sweep: bool, seed: int, train_size: int | None = None) -> list[dict]:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((max(16, n // 1000), dim), np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    bases = rng.standard_normal((len(c), dim, intrinsic), np.float32) / dim ** 0.5  # ~orthonormal columns
    t0 = time.perf_counter()
    base = mixture(n, dim, c, bases, sigma, noise, rng)
    queries = mixture(n_queries, dim, c, bases, sigma, noise, rng)
    print(f"[d={dim}] data: {n:,} x {dim} in {time.perf_counter() - t0:.1f} s ({len(c)} centres, {intrinsic}-d "
          f"subspaces, sigma {sigma}, noise {noise})", flush=True)
    flat, *_ = build_faiss(base, "flat")
    exact, flat_qps = timed_search(flat, queries, 10)
    rows = []
    for kind in kinds:
        if kind == "flat":
            index, params, times = flat, {}, None
        else:
            index, _, _, params, times, _ = build_faiss(base, kind, seed=seed, train_size=train_size, rerank="none")
        settings = [dict(params)]
        if sweep and "nprobe" in params:
            settings = [params | {"nprobe": 1}, params, params | {"nprobe": min(params["nlist"], 4 * params["nprobe"])}]
        elif sweep and "ef_search" in params:
            settings = [params | {"ef_search": 16}, params, params | {"ef_search": 4 * DEFAULT_EF_SEARCH}]
        size = index_bytes(index)
        for s in settings:
            set_search_params(index, s.get("nprobe"), s.get("ef_search"))
            ids, qps = (exact, flat_qps) if kind == "flat" else timed_search(index, queries, 10)
            row = {"dim": dim, "n": n, "kind": kind, "params": s, "build_s": round(times["build"], 2) if times else
                   0.0, "train_s": round(times["train"], 2) if times else 0.0, "index_mb": round(size / 2**20, 1),
                   "bytes_per_vector": round(size / n, 1), "qps": round(qps, 1),
                   "recall@10": round(ann_recall(ids, exact), 4)}
            rows.append(row)
            print(f"[d={dim}] {kind:6s} {json.dumps(s):40s} build {row['build_s']:8.2f} s  {row['index_mb']:9.1f} MB  "
                  f"{row['qps']:10.1f} q/s  recall@10 {row['recall@10']:.4f}", flush=True)
        if kind != "flat":
            del index
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000, help="database vectors per width")
    p.add_argument("--dims", default="384,768")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--sigma", type=float, default=1.0, help="spread within a cluster relative to the centre")
    p.add_argument("--noise", type=float, default=0.1, help="isotropic noise length relative to the centre")
    p.add_argument("--intrinsic", type=int, default=16, help="dimensions of each cluster's subspace")
    p.add_argument("--kinds", default="flat,ivf,hnsw,ivfpq")
    p.add_argument("--threads", type=int, default=None, help="FAISS threads (default: all cores)")
    p.add_argument("--sweep", action="store_true", help="also FAISS's default and 4x search parameters")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-size", type=int, default=None, help="IVF/PQ training sample (default: vitkit's)")
    args = p.parse_args()
    import faiss

    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        rows += run_dim(args.n, dim, args.queries, args.sigma, args.noise, args.intrinsic, args.kinds.split(","),
                        args.sweep, args.seed, args.train_size)
    info = machine_info() | {"faiss": faiss.__version__, "faiss_threads": faiss.omp_get_max_threads(),
                             "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "command": "python " + " ".join(sys.argv)}
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"ann-{args.n}"
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
    lines = [f"ANN indexes on {args.n:,} clustered unit vectors ({args.queries} queries; `{info['command']}`; "
             f"FAISS {faiss.__version__}, {info['faiss_threads']} threads)", "",
             "| width | index | search params | build s | MB | bytes/vector | queries/s | recall@10 vs exact |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-"
        lines.append(f"| {r['dim']} | {r['kind']} | {params} | {r['build_s']} | {r['index_mb']} | {r['bytes_per_vector']} "
                     f"| {r['qps']:,.0f} | {r['recall@10']:.4f} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
