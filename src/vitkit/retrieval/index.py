"""`vitkit index`: a FAISS index over an EMB_DIR, saved with its manifest and the embedding model's identity.

Cosine similarity everywhere: vectors are L2-normalised and every index uses FAISS's inner-product metric
(IVF quantizers default to L2 unless told otherwise, faiss#2083). Kinds (FAISS factory strings):

- `flat`  (`IDMap,Flat`): exact, brute force; memory 4*D + 8 bytes per vector;
- `ivf`   (`IVF{nlist},Flat`): k-means lists, searches `nprobe` of them; nlist = 4*sqrt(N) (at most N/39) by default;
- `hnsw`  (`IDMap,HNSW{M}`): graph, no training, `efSearch` candidates per query; 4*D + ~8*M + 8 bytes per vector;
- `ivfpq` (`IVF{nlist},PQ{m}np`): lists of m-byte product-quantised codes (m | D; D/8 by default), optionally
  re-ranked (`IDMap,...,Refine(SQfp16)`): PQ proposes REFINE_K_FACTOR * k candidates, float16 vectors order them.

`auto` picks by collection size, width and a memory budget (retrieval/budget.py: flat, HNSW, IVF, then IVF-PQ
with float16 re-ranking through IndexRefine, then IVF-PQ alone), and the build measures its recall@10 against
exact search on held-out collection rows. Kinds without FAISS ids of their own are wrapped in IndexIDMap, so
`add_to_index` / `remove_from_index` keep every other vector's id; an update writes new files and switches
to them by replacing index.json, atomically. FAISS's search defaults (nprobe 1,
efSearch 16) are the classic cause of bad results, so the index stores its own (nprobe = max(8, nlist/16),
efSearch 256), and every search may override them. IVF training needs at least `MIN_PER_LIST` (39, FAISS's own warning
threshold) vectors per list, and PQ's 256-centroid codebooks at least 39 * 256: fewer is refused with a clear
line naming what would work.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._files import atomic_path, atomic_write_text
from ..errors import ConfigError, DataError
from . import budget
from .embed import MANIFEST, Embeddings, same_model
from .metrics import ann_recall, exact_topk

KINDS = ("auto", "flat", "ivf", "hnsw", "ivfpq")
TRAIN_PER_LIST = 64  # k-means sample per IVF list (FAISS would take up to 256; 64 trains 4x faster, still >= 39)
# 1M clustered vectors (BENCHMARKS.md, ANN): efSearch 64 gave recall@10 0.76 / 0.73 at D 384 / 768, 256 gave
# 0.88 / 0.875 at 3,100 / 2,500 queries/s (still 10-16x the exact index); FAISS's 16 gave 0.68 / 0.64
DEFAULT_EF_SEARCH = 256
REFINE_K_FACTOR = 8  # IVF-PQ with re-ranking: PQ proposes 8k candidates, their stored vectors order them
RECALL_K, RECALL_QUERIES = 10, 1000  # the recall@10 measured at build, on up to 1,000 held-out collection rows
INDEX_FILE, INDEX_META = "index.faiss", "index.json"


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError("vitkit index/search needs FAISS: pip install faiss-cpu (or 'vitkit[retrieval]')") from None
    return faiss


def choose_kind(n: int, dim: int = 768, max_memory: int | str | None = None) -> str:
    """`auto`'s kind for n x dim vectors within `max_memory` (bytes or '2GB'; budget.plan_index has the rules)."""
    return budget.plan_index(n, dim, max_memory).kind


def default_nprobe(nlist: int) -> int:
    """A sixteenth of the lists, at least 8 (FAISS's default of 1 misses most neighbours on real data)."""
    return min(nlist, max(8, nlist // 16))


def factory_string(kind: str, dim: int, n: int, nlist: int | None = None, pq_m: int | None = None,
                   hnsw_m: int = budget.DEFAULT_HNSW_M, rerank: str | None = None) -> tuple[str, dict[str, Any]]:
    """(FAISS factory string, the parameters it was built with), after checking the training size. Kinds whose
    FAISS index keeps no ids of its own (flat, hnsw, re-ranked IVF-PQ) are wrapped in `IDMap`, so that a removal
    never renumbers the remaining vectors."""
    if kind == "flat":
        return "IDMap,Flat", {}
    if kind == "hnsw":
        return f"IDMap,HNSW{hnsw_m}", {"hnsw_m": hnsw_m}
    if kind not in ("ivf", "ivfpq"):
        raise ConfigError(f"index kind must be one of {', '.join(KINDS)}, got {kind!r}")
    nlist = nlist or budget.default_nlist(n)
    need = budget.MIN_PER_LIST * nlist
    if kind == "ivfpq":
        pq_m = pq_m or budget.default_pq_m(dim)
        if dim % pq_m:
            raise ConfigError(f"ivfpq: the code size m={pq_m} must divide the feature width {dim}")
        need = max(need, budget.MIN_PER_LIST * budget.PQ_CENTROIDS)
    if n < need:
        fit = n // budget.MIN_PER_LIST
        hint = (f"use --nlist {fit} or fewer, or " if fit >= 1 and kind == "ivf" else "use ")
        raise DataError(f"{kind} with nlist={nlist} needs at least {need:,} training vectors "
                        f"({budget.MIN_PER_LIST} per list"
                        + (f", and {budget.MIN_PER_LIST * budget.PQ_CENTROIDS:,} for 256-code PQ"
                           if kind == "ivfpq" else "")
                        + f"); the collection has {n:,}: {hint}flat or hnsw")
    params = {"nlist": nlist, "nprobe": default_nprobe(nlist)}
    if kind == "ivf":
        return f"IVF{nlist},Flat", params
    # `np`: no polysemous training, which only serves Hamming-threshold search (unused here) and made training
    # 50x slower (117 s against 2.3 s for 20k x 64 vectors, IVF128,PQ8, one thread)
    factory = f"IVF{nlist},PQ{pq_m}np"
    params |= {"pq_m": pq_m}
    if rerank is None:
        return factory, params
    refine = {"fp16": "Refine(SQfp16)", "fp32": "RFlat"}[rerank]
    return f"IDMap,{factory},{refine}", params | {"rerank": rerank, "k_factor": REFINE_K_FACTOR}


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def unwrapped(index):
    """The index under an IDMap wrapper (HNSW, flat, IndexRefine), as its own FAISS class."""
    faiss = _faiss()
    return faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index


def search_parameters(index, nprobe: int | None = None, ef_search: int | None = None):
    """FAISS `SearchParameters` for one search call (None when nothing applies to this index): the shared
    index is never changed, so concurrent searches with different values each get their own answer."""
    faiss = _faiss()
    core = unwrapped(index)
    if nprobe is not None and faiss.try_extract_index_ivf(index) is not None:
        ivf_params = faiss.SearchParametersIVF(nprobe=int(nprobe))
        if not isinstance(core, faiss.IndexRefine):
            return ivf_params
        # IndexRefine takes only its own parameter type, carrying the IVF's and its k_factor (default 1: no re-ranking)
        params = faiss.IndexRefineSearchParameters(k_factor=float(core.k_factor), base_index_params=ivf_params)
        params.referenced_objects = [ivf_params]  # the C++ side holds a bare pointer: keep the Python object alive
        return params
    if ef_search is not None and hasattr(core, "hnsw"):
        return faiss.SearchParametersHNSW(efSearch=int(ef_search))
    return None


def set_search_params(index, nprobe: int | None = None, ef_search: int | None = None,
                      k_factor: float | None = None) -> None:
    faiss = _faiss()
    core = unwrapped(index)
    if nprobe is not None:
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = int(nprobe)
    if ef_search is not None and hasattr(core, "hnsw"):
        core.hnsw.efSearch = int(ef_search)
    if k_factor is not None and isinstance(core, faiss.IndexRefine):
        core.k_factor = float(k_factor)


def _apply_stored_params(index, params: dict[str, Any]) -> None:
    set_search_params(index, params.get("nprobe"), params.get("ef_search"), params.get("k_factor"))


def _add(index, vecs: np.ndarray, first_id: int, batch: int = 65536) -> None:
    """Add rows of `vecs` (normalised on the way in, in batches: a memory map is never read whole) with the ids
    first_id, first_id + 1, ...; an index without ids (built by an older vitkit) numbers them by position."""
    faiss = _faiss()
    with_ids = isinstance(index, faiss.IndexIDMap) or isinstance(index, faiss.IndexIVF)
    if not with_ids and index.ntotal != first_id:
        raise DataError("this index numbers its vectors by position and some were removed: rebuild it")
    for i in range(0, len(vecs), batch):
        block = _normalised(vecs[i:i + batch])  # [b, D]
        if with_ids:
            index.add_with_ids(block, np.arange(first_id + i, first_id + i + len(block), dtype=np.int64))
        else:
            index.add(block)


def build_faiss(vecs: np.ndarray, kind: str = "auto", *, nlist: int | None = None, pq_m: int | None = None,
                hnsw_m: int | None = None, nprobe: int | None = None, ef_search: int | None = None,
                train_size: int | None = None, seed: int = 0, batch: int = 65536,
                max_memory: int | str | None = None, rerank: str = "auto"):
    """A trained, filled FAISS index over `vecs` [N, D] (any float dtype, e.g. a memory map; rows are L2-normalised
    on the way in), ids 0..N-1 -> (index, IndexPlan, factory string, search params, {train, build} seconds,
    the training rows)."""
    faiss = _faiss()
    n, dim = vecs.shape
    plan = budget.plan_index(n, dim, max_memory, kind=kind, rerank=rerank, hnsw_m=hnsw_m, nlist=nlist, pq_m=pq_m)
    factory, params = factory_string(plan.kind, dim, n, plan.nlist, plan.pq_m, plan.hnsw_m, plan.rerank)
    if plan.kind == "hnsw":
        params["ef_search"] = int(ef_search or DEFAULT_EF_SEARCH)
    if nprobe is not None and "nprobe" in params:
        params["nprobe"] = min(int(nprobe), params["nlist"])
    t0 = time.perf_counter()
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    train_time = 0.0
    pick = np.zeros(0, dtype=np.int64)
    if not index.is_trained:
        # k-means needs only a sample: TRAIN_PER_LIST per list, and at least 4x the minimum for PQ codebooks
        want = train_size or max(TRAIN_PER_LIST * params["nlist"], budget.MIN_PER_LIST * budget.PQ_CENTROIDS * 4)
        rng = np.random.default_rng(seed)
        pick = np.sort(rng.choice(n, size=min(n, want), replace=False))
        index.train(_normalised(vecs[pick]))
        train_time = time.perf_counter() - t0
    _add(index, vecs, 0, batch)
    _apply_stored_params(index, params)
    return index, plan, factory, params, {"train": train_time, "build": time.perf_counter() - t0}, pick


def measure_recall(index, vecs: np.ndarray, k: int = RECALL_K, queries: int = RECALL_QUERIES,
                   held_out_from: np.ndarray | None = None, seed: int = 0) -> dict[str, Any] | None:
    """ANN recall@k of `index` (ids = rows of `vecs`) against exact search, on up to `queries` rows of the
    collection outside `held_out_from` (the training sample). A query's own row is left out of both answers:
    finding itself says nothing about the index. None when the collection is too small to ask."""
    n = len(vecs)
    if queries <= 0 or n <= k + 1:
        return None
    candidates = np.setdiff1d(np.arange(n), held_out_from if held_out_from is not None else [])
    if len(candidates) == 0:
        candidates = np.arange(n)
    rng = np.random.default_rng(seed + 1)
    rows = np.sort(rng.choice(candidates, size=min(queries, len(candidates)), replace=False))  # [Q]
    q = _normalised(vecs[rows])  # [Q, D]
    _, exact = exact_topk(q, vecs, k, exclude=rows, chunk=64)  # [Q, k], own row excluded
    t0 = time.perf_counter()
    _, found = index.search(q, k + 1)  # [Q, k + 1]: room for the query's own row
    seconds = time.perf_counter() - t0
    approx = np.array([[j for j in ids if j != own][:k] for ids, own in zip(found, rows)])  # [Q, k]
    return {"k": k, "recall": round(ann_recall(approx, exact.numpy()), 4), "queries": int(len(rows)),
            "held_out": held_out_from is not None and len(held_out_from) > 0,
            "search_ms_per_query": round(1000 * seconds / len(rows), 4)}


def _serialized_bytes(path: Path) -> int:
    return path.stat().st_size


def _file_names(generation: int) -> tuple[str, str]:
    """(index file, manifest) of a generation: the first build's plain names, later ones numbered."""
    if generation == 0:
        return INDEX_FILE, MANIFEST
    return f"index.{generation}.faiss", f"manifest.{generation}.jsonl"


def _commit(out: Path, index, write_manifest, meta: dict[str, Any], generation: int) -> dict[str, Any]:
    """Write a new generation of the index folder: the FAISS file and the manifest under new names, then
    index.json naming them (the one atomic step that switches readers over), then the files of every other
    generation. Killed at any point before index.json is replaced, the folder still holds the old index whole."""
    faiss = _faiss()
    index_name, manifest_name = _file_names(generation)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / index_name) as tmp:
        faiss.write_index(index, str(tmp))
    with atomic_path(out / manifest_name) as tmp:
        write_manifest(tmp)
    meta = meta | {"generation": generation, "index_file": index_name, "manifest_file": manifest_name,
                   "index_bytes": _serialized_bytes(out / index_name)}
    atomic_write_text(out / INDEX_META, json.dumps(meta, indent=1))
    current = {index_name, manifest_name}
    for old in [*out.glob("index*.faiss"), *out.glob("manifest*.jsonl")]:
        if old.name not in current:
            old.unlink(missing_ok=True)
    return meta


def _vectors_of(emb: Embeddings, where: str | os.PathLike) -> np.ndarray:
    vecs = emb.vectors
    if vecs.ndim != 2:
        raise DataError(f"{where} holds patch tokens {list(vecs.shape)}; index pooled or cls features "
                        "(`vitkit embed --feature pooled`)")
    return vecs


def build_index(emb_dir: str | os.PathLike, out: str | os.PathLike, kind: str = "auto", *, nlist: int | None = None,
                pq_m: int | None = None, hnsw_m: int | None = None, nprobe: int | None = None,
                ef_search: int | None = None, train_size: int | None = None, seed: int = 0,
                batch: int = 65536, max_memory: int | str | None = None, rerank: str = "auto",
                recall_queries: int = RECALL_QUERIES, overwrite: bool = False) -> dict[str, Any]:
    """Build and save an index over `emb_dir` into the folder `out` (index.faiss, index.json, manifest.jsonl),
    chosen within `max_memory` when `kind` is auto, with its recall@10 measured against exact search."""
    emb = Embeddings(emb_dir)
    vecs = _vectors_of(emb, emb_dir)
    out = Path(out)
    old = _read_meta(out) if (out / INDEX_META).exists() else None
    if old is not None and not overwrite:
        raise DataError(f"{out} already holds an index; pass --overwrite to replace it")
    index, plan, factory, params, times, pick = build_faiss(
        vecs, kind, nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m, nprobe=nprobe, ef_search=ef_search,
        train_size=train_size, seed=seed, batch=batch, max_memory=max_memory, rerank=rerank)
    recall = measure_recall(index, vecs, queries=recall_queries, held_out_from=pick, seed=seed)
    n, dim = vecs.shape
    meta = {"kind": plan.kind, "factory": factory, "metric": "cosine (inner product of L2-normalised vectors)",
            "count": int(n), "dim": int(dim), "params": params, "model": emb.model_identity,
            "embeddings": str(Path(emb_dir).resolve()), "embeddings_dtype": emb.meta["dtype"],
            **source_of(emb), "train_seconds": round(times["train"], 3),
            "build_seconds": round(times["build"], 3), "choice": plan.reason,
            "max_memory_bytes": None if max_memory is None else budget.parse_memory(max_memory),
            "estimated_bytes": plan.estimated_bytes, "recall_at_10": recall, "next_id": int(n), "changes": []}
    generation = 0 if old is None else old.get("generation", 0) + 1
    return _commit(out, index, lambda tmp: shutil.copyfile(Path(emb_dir) / MANIFEST, tmp), meta, generation)


def source_of(emb: Embeddings) -> dict[str, Any]:
    """Where the embedded images came from, as the index records it (the contact sheet reads a hit's image back
    from it when the hit is a sample of a data source, not a file): the spec, split and source settings."""
    return {"source": emb.meta.get("source"), "source_split": emb.meta.get("split", "all"),
            "source_options": emb.meta.get("source_options") or {}}


def image_sources(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Every source an index's vectors were embedded from: its build's, then each --add's."""
    found = [meta, *meta.get("changes", [])]
    return [{"spec": m["source"], "split": m.get("source_split", "all"), "options": m.get("source_options") or {}}
            for m in found if m.get("source")]


def _read_meta(path: Path) -> dict[str, Any]:
    if not (path / INDEX_META).exists():
        raise DataError(f"{path}: not an index folder from `vitkit index` (no {INDEX_META})")
    return json.loads((path / INDEX_META).read_text())


def _write_rows(rows: list[dict]):
    def write(tmp: Path) -> None:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return write


def add_to_index(index_dir: str | os.PathLike, emb_dir: str | os.PathLike) -> dict[str, Any]:
    """Append the vectors of `emb_dir` (embedded by the index's model) to the index in `index_dir`: they get the
    ids next_id, next_id + 1, ...; the existing vectors keep theirs. IVF lists and PQ codebooks are not retrained."""
    index = SearchIndex.load(index_dir)
    emb = Embeddings(emb_dir)
    vecs = _vectors_of(emb, emb_dir)
    if vecs.shape[1] != index.meta["dim"]:
        raise ConfigError(f"{emb_dir} holds {vecs.shape[1]}-d vectors, the index {index.meta['dim']}-d ones: "
                          "add vectors embedded by the index's model")
    index.check_identity(emb.model_identity)
    first = int(index.meta.get("next_id", index.meta["count"]))
    _add(index.index, vecs, first)
    rows = index.rows_with_ids() + [r | {"id": first + i} for i, r in enumerate(emb.rows)]
    n = int(index.index.ntotal)
    change = {"added": int(len(vecs)), "from": str(Path(emb_dir).resolve()), "first_id": first,
              "last_id": first + len(vecs) - 1, **source_of(emb)}
    return _update(index, rows, n, first + len(vecs), change)


def _update(index: SearchIndex, rows: list[dict], n: int, next_id: int, change: dict) -> dict[str, Any]:
    meta = index.meta
    p = meta.get("params", {})
    estimate = budget.estimate_bytes(meta["kind"], n, meta["dim"], hnsw_m=p.get("hnsw_m", budget.DEFAULT_HNSW_M),
                              nlist=p.get("nlist"), pq_m=p.get("pq_m"), rerank=p.get("rerank"))
    new = meta | {"count": n, "next_id": next_id, "estimated_bytes": estimate,
                  "changes": [*meta.get("changes", []), change]}
    out = _commit(index.path, index.index, _write_rows(rows), new, meta.get("generation", 0) + 1)
    limit = meta.get("max_memory_bytes")
    over = limit is not None and estimate > limit
    return out | {"change": change, "over_budget": over}


def removal_ids(index: SearchIndex, spec: str) -> list[int]:
    """The ids named by `spec`: a comma-separated list of ids, or a file listing ids or source paths, one a line
    (a .jsonl manifest: its `id` or `path` fields; a .csv manifest: its `id` or `path` column)."""
    import csv

    by_path: dict[str, list[int]] = {}
    for r in index.rows_with_ids():
        by_path.setdefault(str(r.get("path")), []).append(int(r["id"]))
    live = {i for ids in by_path.values() for i in ids}
    source = Path(spec)
    if source.is_file():
        text = source.read_text()
        if source.suffix == ".jsonl":
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
            names = [str(e["id"]) if "id" in e else str(e.get("path")) for e in entries]
        elif source.suffix == ".csv":
            reader = list(csv.DictReader(text.splitlines()))
            column = "id" if reader and "id" in reader[0] else "path"
            if reader and column not in reader[0]:
                raise ConfigError(f"--remove {spec}: a CSV needs an 'id' or 'path' column")
            names = [r[column] for r in reader]
        else:
            names = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    else:
        names = [part.strip() for part in spec.split(",") if part.strip()]
        if not names or not all(name.lstrip("-").isdigit() for name in names):
            raise ConfigError(f"--remove {spec!r}: neither a file nor a comma-separated list of ids")
    ids, missing = [], []
    for name in names:
        if name.lstrip("-").isdigit() and int(name) in live:
            ids.append(int(name))
        elif name in by_path or str(Path(name).resolve()) in by_path:
            ids += by_path.get(name) or by_path[str(Path(name).resolve())]
        else:
            missing.append(name)
    if missing:
        raise ConfigError(f"--remove: {len(missing)} of {len(names)} entries are not in the index (first: "
                          f"{missing[0]!r}); nothing was removed")
    return sorted(set(ids))


def remove_from_index(index_dir: str | os.PathLike, spec: str) -> dict[str, Any]:
    """Delete the vectors named by `spec` (see `removal_ids`); the others keep their ids."""
    faiss = _faiss()
    index = SearchIndex.load(index_dir)
    ids = np.array(removal_ids(index, spec), dtype=np.int64)
    flat_ids = isinstance(index.index, faiss.IndexIDMap) or isinstance(index.index, faiss.IndexIVF)
    if not flat_ids:
        raise DataError(f"{index_dir} was built by an older vitkit that numbers vectors by position: rebuild it "
                        "to remove from it")
    try:
        index.index.remove_ids(ids)
    except RuntimeError:  # HNSW graphs and IndexRefine cannot delete in place: re-add the rest to the emptied index
        core = unwrapped(index.index)
        kept_ids = faiss.vector_to_array(index.index.id_map)  # [N]
        vecs = core.reconstruct_n(0, core.ntotal)  # [N, D]: exact for HNSW, the float16 store for re-ranking
        keep = ~np.isin(kept_ids, ids)
        index.index.reset()  # keeps the training (IVF centroids, PQ codebooks) and the graph settings
        index.index.add_with_ids(np.ascontiguousarray(vecs[keep]), kept_ids[keep])
    _apply_stored_params(index.index, index.meta.get("params", {}))
    gone = set(ids.tolist())
    rows = [r for r in index.rows_with_ids() if int(r["id"]) not in gone]
    change = {"removed": int(len(ids)), "ids": ids[:20].tolist()}
    return _update(index, rows, int(index.index.ntotal), int(index.meta.get("next_id", index.meta["count"])), change)


@dataclass
class Hit:
    """One search result: the original item (`path`: a file, or `NAME:SPLIT/INDEX`), cosine `score`, its label
    (None when unlabelled) and its `row`: its id in the index (the row of the embeddings for an index built once;
    ids never change when vectors are added or removed); `index`: the index folder it came from, when several
    were searched as one (retrieval/sharded.py), else None."""

    path: str
    score: float
    label: str | None
    row: int
    index: str | None = None


class SearchIndex:
    """A saved index: `SearchIndex.load(path).search(queries [n, D] float32, k) -> [[Hit, ...], ...]`."""

    def __init__(self, path: Path, index, meta: dict[str, Any]):
        self.path, self.index, self.meta = path, index, meta
        self._rows: list[dict] | None = None
        self._by_id: dict[int, dict] | None = None

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = False) -> SearchIndex:
        faiss = _faiss()
        path = Path(path)
        meta = _read_meta(path)
        index_file = path / meta.get("index_file", INDEX_FILE)
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        try:
            index = faiss.read_index(str(index_file), flags)
        except RuntimeError as e:
            raise DataError(f"{index_file}: unreadable FAISS index ({str(e).splitlines()[0][:200]})") from None
        _apply_stored_params(index, meta.get("params", {}))
        return cls(path, index, meta)

    @property
    def model_identity(self) -> dict:
        return dict(self.meta["model"])

    @property
    def rows(self) -> list[dict]:
        if self._rows is None:
            manifest = self.path / self.meta.get("manifest_file", MANIFEST)
            self._rows = [json.loads(line) for line in manifest.read_text().splitlines() if line]
        return self._rows

    def rows_with_ids(self) -> list[dict]:
        """The manifest rows, each with its `id` (a first build's rows are numbered by position)."""
        return [r if "id" in r else r | {"id": i} for i, r in enumerate(self.rows)]

    @property
    def row_by_id(self) -> dict[int, dict]:
        if self._by_id is None:
            self._by_id = {int(r["id"]): r for r in self.rows_with_ids()}
        return self._by_id

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def sources(self) -> list[dict[str, Any]]:
        """Every source this index's vectors were embedded from (for the contact sheet)."""
        return image_sources(self.meta)

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change the stored search settings of this loaded index (per-call values: `search(nprobe=...)`)."""
        set_search_params(self.index, nprobe, ef_search)

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
        rows = self.row_by_id
        return [[Hit(rows[j]["path"], float(s), rows[j].get("label"), int(j)) for s, j in zip(srow, irow) if j >= 0]
                for srow, irow in zip(scores, ids)]
