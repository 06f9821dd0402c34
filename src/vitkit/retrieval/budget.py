"""Choosing a FAISS index from a memory budget (autofaiss's approach, simplified), and what each kind costs.

Bytes for N vectors of width D (ids are int64: IndexIDMap or the IVF lists keep one per vector, so that
removals never renumber the others):

- flat:  N * (4D + 8)                              float32 vectors and ids
- hnsw:  N * (4D + 8M + 8)                         vectors, ~2M int32 links per vector on the base layer, ids
- ivf:   N * (4D + 8) + nlist * 4D                 vectors and ids in the lists, the centroids
- ivfpq: N * (m + 8) + nlist * 4D + 256 * 4D       m-byte codes and ids, centroids, the PQ codebooks,
         + N * 2D (float16) or N * 4D (float32)    with re-ranking: the stored vectors that reorder candidates

The choice, first that fits: flat below AUTO_FLAT_BELOW vectors (exact, and cheap to scan); HNSW with 32 links
(the fastest queries); IVF-Flat; IVF-PQ with
D/8 bytes per vector (fewer if needed) plus float16 re-ranking; IVF-PQ alone with the most bytes per vector that
fit, down to one byte per 64 dimensions. Nothing fits: one line naming what the smallest option needs.

Measured (BENCHMARKS.md, 1M clustered 384-d vectors, recall@10 against exact search): HNSW32 0.88 at 3,100
queries/s, IVF-PQ48 + float16 re-ranking 0.999 at 1,400 in under half the memory, PQ codes alone 0.69. An HNSW
graph with fewer links than 32 (autofaiss's rule takes as many as fit, down to 8) measured worse on both counts
that matter: HNSW19 gave 0.76 at 2,500 queries/s, so a budget too small for HNSW32 goes to IVF instead.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ConfigError

AUTO_FLAT_BELOW = 100_000  # exact search is cheap enough below this (O(N) per query)
DEFAULT_MEMORY = 16 * 2**30  # the budget `auto` assumes when none is given
DEFAULT_HNSW_M = 32
MIN_PER_LIST = 39  # FAISS warns below 39 training points per centroid (clustering.cpp)
PQ_CENTROIDS = 256  # 8-bit PQ codes
MAX_DIMS_PER_PQ_BYTE = 64  # coarser codes than one byte per 64 dimensions keep almost no neighbour information
ID_BYTES = 8
RERANK_BYTES = {"fp16": 2, "fp32": 4}  # bytes per dimension of the re-ranking store
RERANK_CHOICES = ("auto", "none", "fp16", "fp32")
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]+)\s*$")


def parse_memory(text: str | int | float) -> int:
    """'512MB', '2GB', '1.5GiB' -> bytes (KB/MB/GB/TB: powers of 1000, KiB/MiB/GiB/TiB: of 1024); an int is bytes."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"--max-memory must be more than 0 bytes, got {text}")
        return int(text)
    match = _SIZE.match(str(text))
    if not match or match[2].upper() not in UNITS:
        raise ConfigError(f"--max-memory: expected a size with a unit such as 512MB, 2GB or 1.5GiB "
                          f"(units: KB MB GB TB KiB MiB GiB TiB), got {text!r}")
    size = int(float(match[1]) * UNITS[match[2].upper()])
    if size <= 0:
        raise ConfigError(f"--max-memory must be more than 0 bytes, got {text!r}")
    return size


def format_memory(n: float) -> str:
    from ..analysis.cost import format_bytes

    return format_bytes(n)


def hnsw_bytes(n: int, dim: int, hnsw_m: int = DEFAULT_HNSW_M) -> int:
    """Approximate size of an HNSW graph index: float32 vectors plus ~2*M int32 links per vector on the base layer."""
    return n * (4 * dim + 8 * hnsw_m)


def default_nlist(n: int) -> int:
    """4 * sqrt(N) lists, fewer when that would leave under MIN_PER_LIST training vectors per list."""
    return max(1, min(int(round(4 * math.sqrt(n))), n // MIN_PER_LIST))


def default_pq_m(dim: int) -> int:
    """The largest divisor of `dim` not above dim/8 (one byte per 8 dimensions: 48 for 384, 96 for 768)."""
    return max(m for m in range(1, max(1, dim // 8) + 1) if dim % m == 0)


def estimate_bytes(kind: str, n: int, dim: int, *, hnsw_m: int = DEFAULT_HNSW_M, nlist: int | None = None,
                   pq_m: int | None = None, rerank: str | None = None) -> int:
    """The memory an index of `kind` over n x dim vectors takes (the table in the module docstring)."""
    if kind == "flat":
        return n * (4 * dim + ID_BYTES)
    if kind == "hnsw":
        return hnsw_bytes(n, dim, hnsw_m) + n * ID_BYTES
    centroids = (nlist or default_nlist(n)) * 4 * dim
    if kind == "ivf":
        return n * (4 * dim + ID_BYTES) + centroids
    if kind == "ivfpq":
        pq_m = pq_m or default_pq_m(dim)
        return n * (pq_m + ID_BYTES + RERANK_BYTES.get(rerank or "", 0) * dim) + centroids + PQ_CENTROIDS * 4 * dim
    raise ConfigError(f"index kind must be one of auto, flat, ivf, hnsw, ivfpq, got {kind!r}")


@dataclass(frozen=True)
class IndexPlan:
    """What to build: the kind, its parameters, the memory it takes and why it was chosen."""

    kind: str
    estimated_bytes: int
    reason: str
    hnsw_m: int = DEFAULT_HNSW_M
    nlist: int | None = None
    pq_m: int | None = None
    rerank: str | None = None  # "fp16" / "fp32": IVF-PQ candidates re-ranked on stored vectors; None: not


def _pq_sizes(dim: int, most: int) -> list[int]:
    """Code sizes m (divisors of dim, as PQ needs) from `most` down to one byte per MAX_DIMS_PER_PQ_BYTE dims."""
    least = max(1, -(-dim // MAX_DIMS_PER_PQ_BYTE))
    return [m for m in range(most, least - 1, -1) if dim % m == 0]


def plan_index(n: int, dim: int, max_memory: int | str | None = None, *, kind: str = "auto", rerank: str = "auto",
               hnsw_m: int | None = None, nlist: int | None = None, pq_m: int | None = None) -> IndexPlan:
    """The index to build for n x dim vectors within `max_memory` (bytes or '2GB'; None: DEFAULT_MEMORY for the
    automatic choice, no limit for a named kind)."""
    if rerank not in RERANK_CHOICES:
        raise ConfigError(f"--rerank must be one of {', '.join(RERANK_CHOICES)}, got {rerank!r}")
    budget = None if max_memory is None else parse_memory(max_memory)
    limit = budget if budget is not None else DEFAULT_MEMORY
    shown = format_memory(limit)
    most_links = hnsw_m or DEFAULT_HNSW_M

    def fits(size: int) -> bool:
        return size <= limit

    if kind != "auto":
        if kind == "ivfpq":
            m = pq_m or default_pq_m(dim)
            wanted = {"auto": "fp16", "none": None}.get(rerank, rerank)
            size = estimate_bytes("ivfpq", n, dim, nlist=nlist, pq_m=m, rerank=wanted)
            if rerank == "auto" and wanted and not fits(size):  # re-ranking by default only when it fits
                wanted, size = None, estimate_bytes("ivfpq", n, dim, nlist=nlist, pq_m=m)
            plan = IndexPlan("ivfpq", size, "asked for", nlist=nlist, pq_m=m, rerank=wanted)
        else:
            plan = IndexPlan(kind, estimate_bytes(kind, n, dim, hnsw_m=most_links, nlist=nlist), "asked for",
                             hnsw_m=most_links, nlist=nlist)
        if budget is not None and not fits(plan.estimated_bytes):
            raise ConfigError(f"{kind} over {n:,} x {dim} vectors needs ~{format_memory(plan.estimated_bytes)}, more "
                              f"than --max-memory {shown}; raise it, or leave --kind auto to choose one that fits")
        return plan

    flat = estimate_bytes("flat", n, dim)
    if n < AUTO_FLAT_BELOW and fits(flat):
        return IndexPlan("flat", flat, f"exact search: {n:,} vectors fit ({format_memory(flat)} of {shown})")
    # the whole HNSW32 graph or none: fewer links lost recall for little speed (the module docstring)
    size = estimate_bytes("hnsw", n, dim, hnsw_m=most_links)
    if fits(size):
        return IndexPlan("hnsw", size, f"HNSW{most_links}: full vectors and graph fit ({format_memory(size)} of "
                         f"{shown})", hnsw_m=most_links)
    ivf = estimate_bytes("ivf", n, dim, nlist=nlist)
    if fits(ivf):
        return IndexPlan("ivf", ivf, f"IVF-Flat: full vectors fit, an HNSW{most_links} graph does not "
                         f"({format_memory(ivf)} of {shown})", nlist=nlist)
    if n < MIN_PER_LIST * PQ_CENTROIDS:
        raise ConfigError(f"a budget of {shown} is too small for any index of {n:,} x {dim} vectors: flat needs "
                          f"~{format_memory(flat)}, and IVF-PQ needs at least {MIN_PER_LIST * PQ_CENTROIDS:,} vectors "
                          "to train its codebooks")
    sizes = [pq_m] if pq_m else _pq_sizes(dim, default_pq_m(dim))
    stores = [rerank] if rerank in RERANK_BYTES else ([] if rerank == "none" else ["fp16"])
    for store in stores:  # re-ranking first: it recovers most of what quantisation loses
        for m in sizes:
            size = estimate_bytes("ivfpq", n, dim, nlist=nlist, pq_m=m, rerank=store)
            if fits(size):
                return IndexPlan("ivfpq", size, f"IVF-PQ{m} + {store} re-ranking: full vectors do not fit, codes and "
                                 f"{store} vectors do ({format_memory(size)} of {shown})",
                                 nlist=nlist, pq_m=m, rerank=store)
    if rerank in ("auto", "none"):
        for m in (sizes if pq_m else _pq_sizes(dim, max(1, dim // 4))):
            size = estimate_bytes("ivfpq", n, dim, nlist=nlist, pq_m=m)
            if fits(size):
                return IndexPlan("ivfpq", size, f"IVF-PQ{m}: only the {m}-byte codes fit ({format_memory(size)} of "
                                 f"{shown}; re-ranking would need {format_memory(RERANK_BYTES['fp16'] * dim * n)} more)",
                                 nlist=nlist, pq_m=m)
    smallest = estimate_bytes("ivfpq", n, dim, nlist=nlist, pq_m=sizes[-1],
                              rerank=rerank if rerank in RERANK_BYTES else None)
    raise ConfigError(f"a budget of {shown} is too small for any index of {n:,} x {dim} vectors: the smallest, "
                      f"IVF-PQ{sizes[-1]}" + (f" with {rerank} re-ranking" if rerank in RERANK_BYTES else "")
                      + f", needs ~{format_memory(smallest)}")
