"""`vitkit dedup`: groups of near-duplicate images, from the embeddings alone.

Two images are linked when the cosine similarity of their features is at least `threshold`; a group is a
connected component of those links (union-find), so A~B and B~C put A, B and C together even when A and C are
a little further apart. The links come from an exact range search (FAISS `IndexFlatIP.range_search`) in
chunks of queries, so memory stays O(chunk * N) at most and no pair is missed.

Which threshold means "duplicate" depends on the model: a weakly trained one maps everything close together
(median nearest-neighbour similarity 0.99976 for a random tiny ViT on the digits test split), so the result also
reports the collection's nearest-neighbour similarity (each image's best match other than itself) and warns when
the threshold sits below its median, where most images are linked.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import ConfigError
from .embed import Embeddings
from .index import _faiss, _normalised
from .search import score_labels


def exact_cosine_index(vectors: np.ndarray, batch: int = 65536):
    """A FAISS IndexFlatIP over the L2-normalised rows of `vectors` [N, D] (added in batches: a memory map is never
    copied whole)."""
    index = _faiss().IndexFlatIP(vectors.shape[1])
    for i in range(0, len(vectors), batch):
        index.add(_normalised(vectors[i:i + batch]))
    return index


def near_duplicate_pairs(vectors: np.ndarray, threshold: float, chunk: int = 4096,
                         index=None) -> list[tuple[int, int, float]]:
    """(i, j, similarity) with i < j for every pair at or above `threshold` (cosine); `index`: an
    `exact_cosine_index(vectors)` already built."""
    n = len(vectors)
    index = exact_cosine_index(vectors) if index is None else index
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


def nearest_neighbour_similarity(vectors: np.ndarray, chunk: int = 4096, index=None) -> np.ndarray:
    """[N] each row's cosine similarity to its most similar OTHER row (exact; empty below two rows)."""
    n = len(vectors)
    if n < 2:
        return np.zeros(0, np.float32)
    index = exact_cosine_index(vectors) if index is None else index
    out = np.empty(n, np.float32)
    for start in range(0, n, chunk):
        q = _normalised(vectors[start:start + chunk])  # [m, D]
        sims, ids = index.search(q, 2)  # [m, 2]: the row itself and its best match, in either order on a tie
        itself_first = ids[:, 0] == np.arange(start, start + len(q))
        out[start:start + len(q)] = np.where(itself_first, sims[:, 1], sims[:, 0])
    return out


def similarity_summary(nearest: np.ndarray) -> dict[str, Any] | None:
    """{median, p99, images} of nearest-neighbour similarities, None without any."""
    if not len(nearest):
        return None
    return {"median": round(float(np.median(nearest)), 6), "p99": round(float(np.percentile(nearest, 99)), 6),
            "images": len(nearest)}


def threshold_warning(threshold: float, summary: dict[str, Any] | None) -> str | None:
    """One line when `threshold` is below the median nearest-neighbour similarity (most images would group)."""
    if summary is None or threshold >= summary["median"]:
        return None
    median, p99 = score_labels([summary["median"], summary["p99"]])
    return (f"warning: --threshold {threshold:g} is below the median nearest-neighbour similarity ({median}): "
            f"most images will group; try a threshold near the p99 ({p99})")


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
    duplicates (images beyond the first of each group), nearest_neighbour_similarity: {median, p99, images},
    warning (None, or one line when the threshold is below that median)}."""
    if not -1.0 <= threshold <= 1.0:
        raise ConfigError(f"the threshold is a cosine similarity in [-1, 1], got {threshold}")
    emb = Embeddings(emb_dir)
    if emb.vectors.ndim != 2:
        raise ConfigError(f"{emb_dir} holds patch tokens; dedup compares pooled or cls features")
    index = exact_cosine_index(emb.vectors)
    pairs = near_duplicate_pairs(emb.vectors, threshold, index=index)
    summary = similarity_summary(nearest_neighbour_similarity(emb.vectors, index=index))
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
            "duplicates": sum(len(g) - 1 for g in groups), "nearest_neighbour_similarity": summary,
            "warning": threshold_warning(threshold, summary)}
