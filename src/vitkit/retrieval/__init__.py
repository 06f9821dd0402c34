"""Frozen features at scale: embed a collection (resumable, sharded), index it with FAISS, search it by image or
text, find near-duplicates, and measure retrieval (Recall@k, mAP, ANN recall, k-NN).

    embed(model, "photos/", "emb/")          -> emb/embeddings.npy + manifest.jsonl + meta.json
    build_index("emb/", "idx/", "auto")      -> idx/index.faiss + index.json + manifest.jsonl
    SearchIndex.load("idx/").search(q, k=10) -> [[Hit(path, score, label, row), ...], ...]
"""
from __future__ import annotations

from .dedup import dedup
from .embed import Embeddings, embed, features_of, merge, model_identity
from .index import KINDS, Hit, SearchIndex, build_index, choose_kind
from .metrics import ann_recall, evaluate, exact_topk, mean_average_precision, recall_at_k
from .sources import Source, open_source

__all__ = ["KINDS", "Embeddings", "Hit", "SearchIndex", "Source", "ann_recall", "build_index", "choose_kind", "dedup",
           "embed", "evaluate", "exact_topk", "features_of", "mean_average_precision", "merge", "model_identity",
           "open_source", "recall_at_k"]
