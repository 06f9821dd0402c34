"""Several index folders searched as one collection: the way past one machine's RAM (docs/retrieval.md).

A collection too large for one index is embedded and indexed in parts (one `vitkit index` per part, on one
machine or many: each part's index fits its own memory budget); a search asks every part for its k best and
keeps the k best of all, by score. Scores are cosine similarities on every part, so they compare across parts;
with exact (flat) parts the merged answer equals one flat index over the union, ties aside. Each hit names the
part it came from (`Hit.index`), since ids are per part.

    ShardedIndex.load(["idx-0", "idx-1"]).search(q, k=10) -> [[Hit(path, score, label, row, index), ...], ...]

The parts must come from the same model (weights, preprocessing, feature, normalisation) and width: a part
from another model is refused in one line, as a query from another model is.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .embed import same_model
from .index import INDEX_META, Hit, SearchIndex, image_sources, set_search_params


def index_folders(spec: str | os.PathLike | list) -> list[Path]:
    """The index folders `spec` names: one folder, several separated by commas, or a glob pattern ('idx-*')."""
    if isinstance(spec, list | tuple):
        return [Path(s) for s in spec]
    names: list[Path] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        if glob.has_magic(part):
            found = sorted(Path(p) for p in glob.glob(part) if (Path(p) / INDEX_META).is_file())
            if not found:
                raise ConfigError(f"{part}: the pattern matches no index folder (folders holding {INDEX_META})")
            names += found
        else:
            names.append(Path(part))
    if not names:
        raise ConfigError(f"no index folder in {str(spec)!r}")
    return names


class ShardedIndex:
    """Parts of one collection, each a `SearchIndex`, searched together (the module docstring)."""

    def __init__(self, parts: list[SearchIndex]):
        first = parts[0]
        for part in parts[1:]:
            if part.meta["dim"] != first.meta["dim"]:
                raise ConfigError(f"{part.path} holds {part.meta['dim']}-d vectors, {first.path} "
                                  f"{first.meta['dim']}-d ones: the parts of one search come from one model")
            if not same_model(part.model_identity, first.model_identity):
                raise ConfigError(f"{part.path} was embedded by another model than {first.path}: the parts of one "
                                  "search come from one model")
        self.parts = parts
        self.path = first.path
        self.meta: dict[str, Any] = first.meta | {"count": sum(len(p) for p in parts),
                                                  "parts": [str(p.path) for p in parts]}

    @classmethod
    def load(cls, spec, mmap: bool = False) -> ShardedIndex:
        return cls([SearchIndex.load(p, mmap=mmap) for p in index_folders(spec)])

    @property
    def model_identity(self) -> dict:
        return self.parts[0].model_identity

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def check_identity(self, identity: dict) -> None:
        self.parts[0].check_identity(identity)

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        for part in self.parts:
            set_search_params(part.index, nprobe, ef_search)

    def sources(self) -> list[dict[str, Any]]:
        """Every source the parts' vectors were embedded from (for the contact sheet)."""
        return [s for part in self.parts for s in image_sources(part.meta)]

    def search(self, queries: np.ndarray, k: int = 10, *, nprobe: int | None = None,
               ef_search: int | None = None) -> list[list[Hit]]:
        answers = [part.raw_search(queries, k, nprobe, ef_search) for part in self.parts]  # P x ([n, k], [n, k])
        scores = np.concatenate([s for s, _ in answers], axis=1)  # [n, P * k]
        ids = np.concatenate([j for _, j in answers], axis=1)  # [n, P * k]
        owner = np.repeat(np.arange(len(self.parts)), [s.shape[1] for s, _ in answers])  # [P * k]: the part of a column
        scores = np.where(ids >= 0, scores, -np.inf)  # a part with fewer than k vectors pads with -1
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # [n, k]: best first, earlier parts on ties
        out = []
        for srow, irow, orow in zip(scores, ids, order):
            hits = []
            for c in orow:
                if irow[c] < 0:
                    continue
                part = self.parts[owner[c]]
                row = part.row_by_id[int(irow[c])]
                hits.append(Hit(row["path"], float(srow[c]), row.get("label"), int(irow[c]), str(part.path)))
            out.append(hits)
        return out
