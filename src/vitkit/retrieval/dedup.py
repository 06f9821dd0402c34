"""`vitkit dedup`: groups of near-duplicate images, from the embeddings alone.

Two images are linked when the cosine similarity of their features is at least `threshold`; a group is a
connected component of those links (union-find), so A~B and B~C put A, B and C together even when A and C are
a little further apart. The links come from an exact range search (FAISS `IndexFlatIP.range_search`) in
chunks of queries, so memory stays O(chunk * N) at most and no pair is missed.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import ConfigError
from .embed import Embeddings
from .index import _faiss, _normalised


def near_duplicate_pairs(vectors: np.ndarray, threshold: float, chunk: int = 4096) -> list[tuple[int, int, float]]:
    """(i, j, similarity) with i < j for every pair at or above `threshold` (cosine)."""
    faiss = _faiss()
    n, dim = vectors.shape
    index = faiss.IndexFlatIP(dim)
    for i in range(0, n, 65536):
        index.add(_normalised(vectors[i:i + 65536]))
    pairs = []
    radius = float(threshold) - 1e-6  # FAISS keeps scores > radius for inner product; we want >= threshold
    for start in range(0, n, chunk):
        q = _normalised(vectors[start:start + chunk])
        lims, sims, ids = index.range_search(q, radius)
        for a in range(len(q)):
            i = start + a
            for s, j in zip(sims[lims[a]:lims[a + 1]], ids[lims[a]:lims[a + 1]]):
                if j > i:
                    pairs.append((i, int(j), float(s)))
    return pairs


def group_pairs(n: int, pairs: list[tuple[int, int, float]]) -> list[list[int]]:
    """Connected components of size >= 2 (each sorted), largest first."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j, _ in pairs:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))


def dedup(emb_dir: str | os.PathLike, threshold: float = 0.95) -> dict[str, Any]:
    """Near-duplicate groups of an EMB_DIR: {threshold, count, groups: [{rows, paths, labels, min_similarity}],
    duplicates (images beyond the first of each group)}."""
    if not -1.0 <= threshold <= 1.0:
        raise ConfigError(f"the threshold is a cosine similarity in [-1, 1], got {threshold}")
    emb = Embeddings(emb_dir)
    if emb.vectors.ndim != 2:
        raise ConfigError(f"{emb_dir} holds patch tokens; dedup compares pooled or cls features")
    pairs = near_duplicate_pairs(emb.vectors, threshold)
    groups = group_pairs(len(emb), pairs)
    sims: dict[int, float] = {}
    where = {i: g for g, rows in enumerate(groups) for i in rows}
    for i, _j, s in pairs:
        g = where[i]
        sims[g] = min(sims.get(g, 1.0), s)
    rows = emb.rows
    out = [{"rows": g, "paths": [rows[i]["path"] for i in g], "labels": [rows[i].get("label") for i in g],
            "min_link_similarity": round(sims[k], 6)} for k, g in enumerate(groups)]
    return {"embeddings": str(emb_dir), "threshold": threshold, "count": len(emb), "groups": out,
            "duplicates": sum(len(g) - 1 for g in groups)}
