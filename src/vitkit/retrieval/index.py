"""`vitkit index`: a FAISS index over an EMB_DIR, saved with its manifest and the embedding model's identity.

Cosine similarity everywhere: vectors are L2-normalised and every index uses FAISS's inner-product metric
(IVF quantizers default to L2 unless told otherwise, faiss#2083). Kinds (FAISS factory strings):

- `flat`  (`Flat`): exact, brute force; memory 4*D bytes per vector;
- `ivf`   (`IVF{nlist},Flat`): k-means lists, searches `nprobe` of them; nlist = 4*sqrt(N) (at most N/39) by default;
- `hnsw`  (`HNSW{M}`): graph, no training, `efSearch` candidates per query; 4*D + ~8*M bytes per vector;
- `ivfpq` (`IVF{nlist},PQ{m}`): lists of m-byte product-quantised codes (m | D; D/8 by default).

`auto` picks by collection size and a memory budget (see `choose_kind`). FAISS's search defaults (nprobe 1,
efSearch 16) are the classic cause of bad results, so the index stores its own (nprobe = max(8, nlist/16),
efSearch 256), and every search may override them. IVF training needs at least `MIN_PER_LIST` (39, FAISS's own warning
threshold) vectors per list, and PQ's 256-centroid codebooks at least 39 * 256: fewer is refused with a clear
line naming what would work.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._files import atomic_path, atomic_write_text
from ..errors import ConfigError, DataError
from .embed import MANIFEST, Embeddings, same_model

KINDS = ("auto", "flat", "ivf", "hnsw", "ivfpq")
MIN_PER_LIST = 39  # FAISS warns below 39 training points per centroid (clustering.cpp)
PQ_CENTROIDS = 256  # 8-bit PQ codes
TRAIN_PER_LIST = 64  # k-means sample per IVF list (FAISS would take up to 256; 64 trains 4x faster, still >= 39)
# 1M clustered vectors (BENCHMARKS.md, ANN): efSearch 64 gave recall@10 0.76 / 0.73 at D 384 / 768, 256 gave
# 0.88 / 0.875 at 3,100 / 2,500 queries/s (still 10-16x the exact index); FAISS's 16 gave 0.68 / 0.64
DEFAULT_EF_SEARCH = 256
DEFAULT_HNSW_M = 32
AUTO_FLAT_BELOW = 100_000  # exact search is cheap enough below this (4 * D bytes per vector, O(N) per query)
DEFAULT_MEMORY_GB = 16.0  # `auto` keeps full vectors (hnsw) while they and the graph fit in this; else IVF-PQ
INDEX_FILE, INDEX_META = "index.faiss", "index.json"


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError("vitkit index/search needs FAISS: pip install faiss-cpu (or 'vitkit[retrieval]')") from None
    return faiss


def hnsw_bytes(n: int, dim: int, hnsw_m: int = DEFAULT_HNSW_M) -> int:
    """Approximate size of an HNSW index: float32 vectors plus ~2*M int32 links per vector on the base layer."""
    return n * (4 * dim + 8 * hnsw_m)


def choose_kind(n: int, dim: int = 768, memory_gb: float = DEFAULT_MEMORY_GB) -> str:
    """`auto`: flat below AUTO_FLAT_BELOW vectors (exact and cheap), hnsw while its vectors and graph fit in
    `memory_gb` (the best recall per query time), ivfpq beyond (D/8 bytes per vector, lower recall)."""
    if n < AUTO_FLAT_BELOW:
        return "flat"
    return "hnsw" if hnsw_bytes(n, dim) <= memory_gb * 2**30 else "ivfpq"


def default_nlist(n: int) -> int:
    """4 * sqrt(N) lists, fewer when that would leave under MIN_PER_LIST training vectors per list."""
    return max(1, min(int(round(4 * math.sqrt(n))), n // MIN_PER_LIST))


def default_nprobe(nlist: int) -> int:
    """A sixteenth of the lists, at least 8 (FAISS's default of 1 misses most neighbours on real data)."""
    return min(nlist, max(8, nlist // 16))


def default_pq_m(dim: int) -> int:
    """The largest divisor of `dim` not above dim/8 (one byte per 8 dimensions: 48 for 384, 96 for 768)."""
    return max(m for m in range(1, max(1, dim // 8) + 1) if dim % m == 0)


def factory_string(kind: str, dim: int, n: int, nlist: int | None = None, pq_m: int | None = None,
                   hnsw_m: int = DEFAULT_HNSW_M) -> tuple[str, dict[str, Any]]:
    """(FAISS factory string, the parameters it was built with), after checking the training size."""
    if kind == "flat":
        return "Flat", {}
    if kind == "hnsw":
        return f"HNSW{hnsw_m}", {"hnsw_m": hnsw_m}
    if kind not in ("ivf", "ivfpq"):
        raise ConfigError(f"index kind must be one of {', '.join(KINDS)}, got {kind!r}")
    nlist = nlist or default_nlist(n)
    need = MIN_PER_LIST * nlist
    if kind == "ivfpq":
        pq_m = pq_m or default_pq_m(dim)
        if dim % pq_m:
            raise ConfigError(f"ivfpq: the code size m={pq_m} must divide the feature width {dim}")
        need = max(need, MIN_PER_LIST * PQ_CENTROIDS)
    if n < need:
        fit = n // MIN_PER_LIST
        hint = (f"use --nlist {fit} or fewer, or " if fit >= 1 and kind == "ivf" else "use ")
        raise DataError(f"{kind} with nlist={nlist} needs at least {need:,} training vectors ({MIN_PER_LIST} per list"
                        + (f", and {MIN_PER_LIST * PQ_CENTROIDS:,} for 256-code PQ" if kind == "ivfpq" else "")
                        + f"); the collection has {n:,}: {hint}flat or hnsw")
    params = {"nlist": nlist, "nprobe": default_nprobe(nlist)}
    if kind == "ivf":
        return f"IVF{nlist},Flat", params
    return f"IVF{nlist},PQ{pq_m}", params | {"pq_m": pq_m}


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def search_parameters(index, nprobe: int | None = None, ef_search: int | None = None):
    """FAISS `SearchParameters` for one search call (None when nothing applies to this index): the shared
    index is never changed, so concurrent searches with different values each get their own answer."""
    faiss = _faiss()
    if nprobe is not None and faiss.try_extract_index_ivf(index) is not None:
        return faiss.SearchParametersIVF(nprobe=int(nprobe))
    if ef_search is not None and hasattr(index, "hnsw"):
        return faiss.SearchParametersHNSW(efSearch=int(ef_search))
    return None


def set_search_params(index, nprobe: int | None = None, ef_search: int | None = None) -> None:
    faiss = _faiss()
    if nprobe is not None:
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = int(nprobe)
    if ef_search is not None and hasattr(index, "hnsw"):
        index.hnsw.efSearch = int(ef_search)


def build_faiss(vecs: np.ndarray, kind: str = "auto", *, nlist: int | None = None, pq_m: int | None = None,
                hnsw_m: int = DEFAULT_HNSW_M, nprobe: int | None = None, ef_search: int | None = None,
                train_size: int | None = None, seed: int = 0, batch: int = 65536,
                memory_gb: float = DEFAULT_MEMORY_GB):
    """A trained, filled FAISS index over `vecs` [N, D] (any float dtype, e.g. a memory map; rows are L2-normalised
    on the way in) -> (index, kind, factory string, search params, {train, build} seconds)."""
    faiss = _faiss()
    n, dim = vecs.shape
    kind = choose_kind(n, dim, memory_gb) if kind == "auto" else kind
    factory, params = factory_string(kind, dim, n, nlist, pq_m, hnsw_m)
    if kind == "hnsw":
        params["ef_search"] = int(ef_search or DEFAULT_EF_SEARCH)
    if nprobe is not None and "nprobe" in params:
        params["nprobe"] = min(int(nprobe), params["nlist"])
    t0 = time.perf_counter()
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    train_time = 0.0
    if not index.is_trained:
        # k-means needs only a sample: TRAIN_PER_LIST per list, and at least 4x the minimum for PQ codebooks
        want = train_size or max(TRAIN_PER_LIST * params["nlist"], MIN_PER_LIST * PQ_CENTROIDS * 4)
        rng = np.random.default_rng(seed)
        pick = np.sort(rng.choice(n, size=min(n, want), replace=False))
        index.train(_normalised(vecs[pick]))
        train_time = time.perf_counter() - t0
    for i in range(0, n, batch):
        index.add(_normalised(vecs[i:i + batch]))
    set_search_params(index, params.get("nprobe"), params.get("ef_search"))
    return index, kind, factory, params, {"train": train_time, "build": time.perf_counter() - t0}


def build_index(emb_dir: str | os.PathLike, out: str | os.PathLike, kind: str = "auto", *, nlist: int | None = None,
                pq_m: int | None = None, hnsw_m: int = DEFAULT_HNSW_M, nprobe: int | None = None,
                ef_search: int | None = None, train_size: int | None = None, seed: int = 0,
                batch: int = 65536, memory_gb: float = DEFAULT_MEMORY_GB, overwrite: bool = False) -> dict[str, Any]:
    """Build and save an index over `emb_dir` into the folder `out` (index.faiss, index.json, manifest.jsonl)."""
    faiss = _faiss()
    emb = Embeddings(emb_dir)
    vecs = emb.vectors
    if vecs.ndim != 2:
        raise DataError(f"{emb_dir} holds patch tokens {list(vecs.shape)}; index pooled or cls features "
                        "(`vitkit embed --feature pooled`)")
    out = Path(out)
    if (out / INDEX_META).exists() and not overwrite:
        raise DataError(f"{out} already holds an index; pass --overwrite to replace it")
    index, kind, factory, params, times = build_faiss(vecs, kind, nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m,
                                                      nprobe=nprobe, ef_search=ef_search, train_size=train_size,
                                                      seed=seed, batch=batch, memory_gb=memory_gb)
    n, dim = vecs.shape
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / INDEX_FILE) as tmp:
        faiss.write_index(index, str(tmp))
    with atomic_path(out / MANIFEST) as tmp:
        shutil.copyfile(Path(emb_dir) / MANIFEST, tmp)
    meta = {"kind": kind, "factory": factory, "metric": "cosine (inner product of L2-normalised vectors)",
            "count": int(n), "dim": int(dim), "params": params, "model": emb.model_identity,
            "embeddings": str(Path(emb_dir).resolve()), "embeddings_dtype": emb.meta["dtype"],
            "source": emb.meta.get("source"), "train_seconds": round(times["train"], 3),
            "build_seconds": round(times["build"], 3), "index_bytes": (out / INDEX_FILE).stat().st_size}
    atomic_write_text(out / INDEX_META, json.dumps(meta, indent=1))
    return meta


@dataclass
class Hit:
    """One search result: the original item (`path`: a file, or `NAME:SPLIT/INDEX`), cosine `score`, its label
    (None when unlabelled) and its `row` in the embeddings / manifest."""

    path: str
    score: float
    label: str | None
    row: int


class SearchIndex:
    """A saved index: `SearchIndex.load(path).search(queries [n, D] float32, k) -> [[Hit, ...], ...]`."""

    def __init__(self, path: Path, index, meta: dict[str, Any]):
        self.path, self.index, self.meta = path, index, meta
        self._rows: list[dict] | None = None

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = False) -> SearchIndex:
        faiss = _faiss()
        path = Path(path)
        if not (path / INDEX_META).exists():
            raise DataError(f"{path}: not an index folder from `vitkit index` (no {INDEX_META})")
        meta = json.loads((path / INDEX_META).read_text())
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        try:
            index = faiss.read_index(str(path / INDEX_FILE), flags)
        except RuntimeError as e:
            raise DataError(f"{path / INDEX_FILE}: unreadable FAISS index ({str(e).splitlines()[0][:200]})") from None
        params = meta.get("params", {})
        set_search_params(index, params.get("nprobe"), params.get("ef_search"))
        return cls(path, index, meta)

    @property
    def model_identity(self) -> dict:
        return dict(self.meta["model"])

    @property
    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = [json.loads(line) for line in (self.path / MANIFEST).read_text().splitlines() if line]
        return self._rows

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def check_identity(self, identity: dict) -> None:
        """Refuse query features from another model (weights, preprocessing, feature kind or normalisation)."""
        if not same_model(self.model_identity, identity):
            mine, theirs = self.model_identity, identity
            what = next(k for k in ("weights_sha256", "preprocess", "feature", "normalized") if mine.get(k) != theirs.get(k))
            raise ConfigError(f"the query features come from another model than the index's ({what} differs: index "
                              f"{mine.get('checkpoint') or mine.get('arch')}, query {theirs.get('checkpoint') or theirs.get('arch')}); "
                              "embed the queries with the index's model")

    def raw_search(self, queries: np.ndarray, k: int, nprobe: int | None = None,
                   ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores [n, k], rows [n, k]; -1 where the index found fewer than k) for normalised queries."""
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None]
        if q.ndim != 2 or q.shape[1] != self.meta["dim"]:
            raise ConfigError(f"queries must be [n, {self.meta['dim']}] (the index's feature width), got {list(q.shape)}")
        if k < 1:
            raise ConfigError(f"k must be at least 1, got {k}")
        # per-call parameters, not a mutation of the shared index: the server searches from several threads
        params = search_parameters(self.index, nprobe, ef_search)
        scores, ids = self.index.search(_normalised(q), int(k), params=params)  # [n, k] each
        return scores, ids

    def search(self, queries: np.ndarray, k: int = 10, *, nprobe: int | None = None,
               ef_search: int | None = None) -> list[list[Hit]]:
        scores, ids = self.raw_search(queries, k, nprobe, ef_search)
        rows = self.rows
        return [[Hit(rows[j]["path"], float(s), rows[j].get("label"), int(j)) for s, j in zip(srow, irow) if j >= 0]
                for srow, irow in zip(scores, ids)]
