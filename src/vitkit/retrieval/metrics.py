"""Retrieval evaluation on frozen features. Three different questions, three measures (names differ across papers,
so each is defined here):

- **Recall@k (retrieval)**, the metric-learning definition (Oh Song et al. 2016; Musgrave et al. 2020): the share
  of queries with at least one same-label item among their k nearest gallery items. When the queries are the
  gallery itself (leave-one-out), a query is never its own neighbour; queries only partly in the gallery
  (`exclude`: the gallery row of each query's own item, -1 for none) never retrieve their own entry either.
- **mAP**: the mean over queries of average precision over the FULL gallery ranking (relevant = same label;
  AP = mean of precision@i over the ranks i of the relevant items). Queries with no relevant item are left out.
- **ANN recall@k** (a property of the index, not the features): |ANN top-k ∩ exact top-k| / k, averaged over
  queries: how many of the true k nearest neighbours the approximate index returns.

The k-NN classifier is `vitkit.probe.knn_classify` (DINO's weighted vote, k=20, T=0.07), shared with the
self-supervised evaluation; `evaluate` reports it beside these.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DataError
from ..probe import KNN_K, KNN_T, knn_classify, mask_excluded


def _tensor(x) -> torch.Tensor:
    return F.normalize(torch.from_numpy(np.array(x, dtype=np.float32)), dim=1)


def excluded_rows(n_queries: int, exclude_self: bool = False, exclude=None) -> torch.Tensor | None:
    """Each query's own gallery row ([M] long, -1: not in the gallery), or None when no query is excluded from
    anything. `exclude_self`: the queries are the gallery in the same order (query i is row i)."""
    if exclude_self:
        return torch.arange(n_queries)
    if exclude is None:
        return None
    rows = torch.as_tensor(np.asarray(exclude), dtype=torch.long)
    if rows.shape != (n_queries,):
        raise ValueError(f"exclude needs one gallery row (or -1) per query: {n_queries}, got {list(rows.shape)}")
    return rows if bool((rows >= 0).any()) else None


GALLERY_BLOCK = 65536  # gallery rows normalised and scored at a time: a memory-mapped collection is never read whole


@torch.no_grad()
def exact_topk(queries, gallery, k: int, *, exclude_self: bool = False, exclude=None,
               chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute-force cosine top-k: (scores [M, k], gallery rows [M, k]), best first. `exclude_self`: queries are the
    gallery in the same order and never retrieve themselves; `exclude` [M]: the gallery row each query never
    retrieves (-1: none). The gallery (an array or a memory map, any float dtype) is read once, GALLERY_BLOCK rows
    at a time, keeping each query's best k so far."""
    q = _tensor(queries)
    own = excluded_rows(len(q), exclude_self, exclude)
    n = len(gallery)
    k = min(k, n - int(own is not None))
    best_s = torch.full((len(q), 0), -math.inf)  # [M, <=k]
    best_j = torch.zeros((len(q), 0), dtype=torch.long)
    for start in range(0, n, GALLERY_BLOCK):
        g = _tensor(gallery[start:start + GALLERY_BLOCK])  # [b, D]
        block_s, block_j = [], []
        for i in range(0, len(q), chunk):
            sim = q[i:i + chunk] @ g.T  # [m, b]
            if own is not None:
                local = own[i:i + chunk] - start  # [m]: the excluded row's place in this block
                mask_excluded(sim, torch.where((local >= 0) & (local < len(g)), local, -1))
            s, j = sim.topk(min(k, len(g)), dim=1)  # [m, k]
            block_s.append(s)
            block_j.append(j + start)
        s = torch.cat([best_s, torch.cat(block_s)], dim=1)  # [M, <=2k]
        j = torch.cat([best_j, torch.cat(block_j)], dim=1)
        best_s, order = s.topk(min(k, s.shape[1]), dim=1)
        best_j = j.gather(1, order)
    return best_s, best_j


def recall_at_k(neighbour_labels: torch.Tensor, query_labels: torch.Tensor, ks: Sequence[int] = (1, 5, 10)) -> dict:
    """Retrieval Recall@k in % from the labels of each query's ranked neighbours [M, K] (K >= max(ks))."""
    hit = neighbour_labels == query_labels.view(-1, 1)  # [M, K]
    return {f"R@{k}": 100.0 * float(hit[:, :k].any(dim=1).float().mean()) for k in ks if k <= hit.shape[1]}


@torch.no_grad()
def mean_average_precision(queries, query_labels: torch.Tensor, gallery, gallery_labels: torch.Tensor, *,
                           exclude_self: bool = False, exclude=None, chunk: int = 256) -> float:
    """mAP in % over the full gallery ranking (see the module docstring; `exclude_self`, `exclude` as in
    `exact_topk`)."""
    q, g = _tensor(queries), _tensor(gallery)
    own = excluded_rows(len(q), exclude_self, exclude)
    aps = []
    for i in range(0, len(q), chunk):
        sim = q[i:i + chunk] @ g.T  # [m, N]
        if own is not None:
            mask_excluded(sim, own[i:i + chunk])
        order = sim.argsort(dim=1, descending=True, stable=True)  # [m, N]
        rel = (gallery_labels[order] == query_labels[i:i + chunk].view(-1, 1)).float()  # [m, N] in rank order
        if own is not None:
            rel[order == own[i:i + chunk].view(-1, 1)] = 0  # the query itself (ranked last at -inf) is not relevant
        n_rel = rel.sum(dim=1)
        precision = rel.cumsum(dim=1) / torch.arange(1, rel.shape[1] + 1)  # precision@i
        ap = (precision * rel).sum(dim=1) / n_rel.clamp(min=1)
        aps.append(ap[n_rel > 0])
    all_ap = torch.cat(aps)
    return 100.0 * float(all_ap.mean()) if len(all_ap) else float("nan")


def ann_recall(approx_ids, exact_ids) -> float:
    """ANN recall@k: mean |approx top-k ∩ exact top-k| / k (k = exact_ids.shape[1]); -1 ids count as misses."""
    a, e = np.asarray(approx_ids), np.asarray(exact_ids)
    k = e.shape[1]
    found = [len(set(ar[:k].tolist()) & set(er.tolist())) for ar, er in zip(a, e)]
    return float(np.mean(found) / k)


def label_ids(query_labels: list, gallery_labels: list) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """String labels of both sides -> int tensors over one shared class list (None labels are refused)."""
    if any(x is None for x in query_labels) or any(x is None for x in gallery_labels):
        raise DataError("retrieval Recall@k, mAP and k-NN need a label for every image (class folders or a "
                        "path,label manifest)")
    names = sorted(set(query_labels) | set(gallery_labels))
    lut = {n: i for i, n in enumerate(names)}
    return (torch.tensor([lut[x] for x in query_labels]), torch.tensor([lut[x] for x in gallery_labels]), names)


def evaluate(query_vecs, query_labels: list, gallery_vecs=None, gallery_labels: list | None = None, *,
             exclude=None, ks: Sequence[int] = (1, 5, 10), map_: bool = True, knn_k: int = KNN_K,
             knn_t: float = KNN_T, index=None, ann_k: int = 10) -> dict[str, Any]:
    """Recall@k, mAP and k-NN top-1 of the queries against the gallery (leave-one-out when no gallery is given;
    `exclude` [M]: the gallery row of each query's own item, -1 for none, never retrieved); with a `SearchIndex`
    over the gallery, also its ANN recall@ann_k against exact search and the Recall@k the index itself delivers."""
    self_query = gallery_vecs is None
    if self_query:
        gallery_vecs, gallery_labels = query_vecs, query_labels
    qy, gy, names = label_ids(query_labels, gallery_labels)
    own = excluded_rows(len(qy), self_query, exclude)
    K = max(max(ks), ann_k)
    _, ids = exact_topk(query_vecs, gallery_vecs, K, exclude=own)
    out: dict[str, Any] = {"queries": len(qy), "gallery": len(gy), "leave_one_out": self_query,
                           "own_entries_excluded": 0 if own is None else int((own >= 0).sum()),
                           "recall": recall_at_k(gy[ids], qy, ks)}
    if map_:
        out["mAP"] = mean_average_precision(query_vecs, qy, gallery_vecs, gy, exclude=own)
    knn = knn_classify(_tensor(gallery_vecs), gy, _tensor(query_vecs), qy, k=knn_k, T=knn_t, num_classes=len(names),
                       exclude=own)
    out["knn"] = {"top1": knn["top1"], "top5": knn["top5"], "k": knn_k, "T": knn_t}
    if index is not None:
        extra = int(own is not None)  # the index returns a query's own entry first: ask for one more and drop it
        _, approx = index.raw_search(np.asarray(query_vecs, dtype=np.float32), K + extra)
        approx = torch.as_tensor(approx)  # [M, K + extra], -1 where the index found fewer
        if own is not None:
            approx = torch.stack([row[row != mine][:K] if mine >= 0 and (row == mine).any() else row[:K]
                                  for mine, row in zip(own.tolist(), approx)])
        out["ann_recall"] = {f"recall@{ann_k}": ann_recall(approx[:, :ann_k].numpy(), ids[:, :ann_k].numpy()),
                             "kind": index.meta["kind"], "params": index.meta.get("params", {})}
        found = gy[approx.clamp(min=0)].masked_fill(approx < 0, -1)
        out["index_recall"] = recall_at_k(found, qy, [k for k in ks if k <= ids.shape[1]])
    return out
