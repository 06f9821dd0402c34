"""Indexes chosen by a memory budget (with IVF-PQ re-ranking), their measured recall, and incremental add/remove.

Real FAISS on real files: EMB_DIRs written in `vitkit embed`'s layout from random unit vectors (fine for recall:
exact neighbours are well defined), a numpy brute force as the reference, the CLI run in-process."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import vitkit._files
from vitkit.cli.main import main as cli
from vitkit.errors import ConfigError
from vitkit.retrieval.budget import parse_memory, plan_index
from vitkit.retrieval.index import SearchIndex, add_to_index, build_index, remove_from_index

IDENTITY = {"checkpoint": "test.pt", "weights_sha256": "a" * 64, "family": "vit", "arch": "vit_test",
            "preprocess": {"img_size": 32}, "feature": "pooled", "normalized": True}


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_emb(path: Path, vecs: np.ndarray, identity: dict = IDENTITY, prefix: str = "img") -> Path:
    """An EMB_DIR as `vitkit embed` leaves it: embeddings.npy, manifest.jsonl, meta.json."""
    path.mkdir(parents=True)
    np.save(path / "embeddings.npy", vecs)
    (path / "manifest.jsonl").write_text("".join(json.dumps({"row": i, "path": f"/photos/{prefix}{i}.jpg",
                                                             "label": None}) + "\n" for i in range(len(vecs))))
    (path / "meta.json").write_text(json.dumps({"count": len(vecs), "dim": vecs.shape[1], "dtype": "float32",
                                                "source": "/photos", "model": identity}))
    return path


def exact_ids(queries: np.ndarray, base: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ base.T), axis=1, kind="stable")[:, :k]  # [Q, k]


def recall_excluding_self(index: SearchIndex, base: np.ndarray, rows: np.ndarray, k: int = 10) -> float:
    """Recall@k of the index on collection rows as queries, each one's own row left out (numpy reference)."""
    sims = base[rows] @ base.T  # [Q, N]
    sims[np.arange(len(rows)), rows] = -np.inf
    truth = np.argsort(-sims, axis=1)[:, :k]
    _, found = index.raw_search(base[rows], k + 1)
    got = [[j for j in ids if j != own][:k] for ids, own in zip(found, rows)]
    return float(np.mean([len(set(g) & set(t)) / k for g, t in zip(got, truth)]))


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """12,000 x 32 unit vectors: enough to train 256-code PQ (39 * 256 = 9,984)."""
    vecs = unit_vectors(12_000, 32, seed=0)
    return write_emb(tmp_path_factory.mktemp("coll") / "emb", vecs), vecs


@pytest.fixture(scope="module")
def ivfpq_pair(tmp_path_factory, collection):
    """The same IVF64,PQ4 index over the collection, without and with float16 re-ranking: (folder, build report)."""
    emb, _ = collection
    root = tmp_path_factory.mktemp("pq")
    return {store: (root / store, build_index(emb, root / store, "ivfpq", pq_m=4, nlist=64, rerank=store))
            for store in ("none", "fp16")}


def run_cli(argv, capsys) -> tuple[int, str, str]:
    code = cli(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------- budget
def test_memory_sizes_parse_with_units_and_refuse_the_rest():
    assert parse_memory("512MB") == 512 * 10**6 and parse_memory("2GB") == 2 * 10**9
    assert parse_memory("1.5GiB") == 3 * 2**29 and parse_memory("100 kib") == 102_400 and parse_memory(4096) == 4096
    for bad in ("16", "2 parsecs", "-1GB", "0MB", "GB", ""):
        with pytest.raises(ConfigError, match="--max-memory"):
            parse_memory(bad)


def test_the_choice_follows_the_budget_at_1m_vectors():
    n, d = 10**6, 384
    assert plan_index(n, d, "4GB").kind == "hnsw" and plan_index(n, d, "4GB").hnsw_m == 32
    # room for 19 links ((1.7e9 / 1e6 - 4 * 384 - 8) / 8): HNSW19 measured 0.76 recall@10, so IVF instead
    assert plan_index(n, d, "1.7GB").kind == "ivf" and "an HNSW32 graph does not" in plan_index(n, d, "1.7GB").reason
    assert plan_index(n, d, "1.6GB").kind == "ivf"  # full vectors fit, an HNSW32 graph does not
    assert plan_index(n, d, "1.9GB", hnsw_m=16).hnsw_m == 16  # the links asked for, when they fit
    reranked = plan_index(n, d, "1GB")
    assert (reranked.kind, reranked.pq_m, reranked.rerank) == ("ivfpq", 48, "fp16")
    assert plan_index(n, d, "1GB", rerank="none").rerank is None
    codes = plan_index(n, d, "200MB")  # no room for float16 vectors (768 MB): the most code bytes that fit
    assert (codes.kind, codes.pq_m, codes.rerank) == ("ivfpq", 96, None)
    assert plan_index(n, d, "30MB").pq_m == 12  # 12 + 8 id bytes per vector, and 6.1 MB of IVF4000 centroids
    assert 0.8 * parse_memory("1GB") < reranked.estimated_bytes <= parse_memory("1GB")  # the budget limits it
    assert codes.estimated_bytes <= parse_memory("200MB")  # capped at D/4 code bytes
    assert plan_index(50_000, d, "1GB").kind == "flat"  # small collections: exact search
    with pytest.raises(ConfigError, match=r"too small for any index of 1,000,000 x 384 .* IVF-PQ6, needs ~"):
        plan_index(n, d, "15MB")
    with pytest.raises(ConfigError, match="IVF-PQ needs at least 9,984 vectors"):
        plan_index(5000, d, "10KB")
    with pytest.raises(ConfigError, match="flat over 1,000,000 x 384 vectors needs ~.* more than --max-memory"):
        plan_index(n, d, "1GB", kind="flat")


def test_cli_builds_within_budget_and_reports_choice_memory_and_recall(tmp_path, collection, capsys):
    emb, vecs = collection
    code, out, _ = run_cli(["index", str(emb), "--out", str(tmp_path / "pq"), "--max-memory", "1MB", "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    saved = json.loads((tmp_path / "pq" / "index.json").read_text())
    assert report["kind"] == saved["kind"] == "ivfpq" and saved["params"]["rerank"] == "fp16"
    assert saved["factory"].endswith("Refine(SQfp16)") and "re-ranking" in saved["choice"]
    assert saved["estimated_bytes"] <= saved["max_memory_bytes"] == 10**6
    actual = (tmp_path / "pq" / "index.faiss").stat().st_size
    assert saved["index_bytes"] == actual and 0.75 < saved["estimated_bytes"] / actual < 1.33
    index = SearchIndex.load(tmp_path / "pq")
    rows = np.arange(0, len(vecs), 60)
    measured = saved["recall_at_10"]
    assert measured["queries"] == 1000 and measured["held_out"]
    assert abs(measured["recall"] - recall_excluding_self(index, vecs, rows)) < 0.08  # the same quantity
    code, out, _ = run_cli(["index", str(emb), "--out", str(tmp_path / "flat"), "--max-memory", "4MB"], capsys)
    assert code == 0 and "choice: exact search: 12,000 vectors fit" in out
    flat = json.loads((tmp_path / "flat" / "index.json").read_text())
    assert flat["kind"] == "flat" and flat["recall_at_10"]["recall"] == 1.0
    code, out, err = run_cli(["index", str(emb), "--out", str(tmp_path / "x"), "--max-memory", "10KB"], capsys)
    assert code != 0 and err.count("\n") == 1 and "too small for any index of 12,000 x 32" in err
    code, out, err = run_cli(["index", str(emb), "--out", str(tmp_path / "x"), "--max-memory", "lots"], capsys)
    assert code != 0 and err.count("\n") == 1 and "expected a size with a unit" in err


def test_reranking_raises_ivfpq_recall_on_the_same_data(collection, ivfpq_pair):
    _, vecs = collection
    (plain_dir, plain), (reranked_dir, reranked) = ivfpq_pair["none"], ivfpq_pair["fp16"]
    assert "rerank" not in plain["params"] and reranked["params"]["rerank"] == "fp16"
    rows = np.arange(0, len(vecs), 40)
    ours = [recall_excluding_self(SearchIndex.load(folder), vecs, rows) for folder in (plain_dir, reranked_dir)]
    assert ours[1] > ours[0] + 0.2, ours  # re-ranking 80 PQ candidates on float16 vectors
    assert reranked["recall_at_10"]["recall"] > plain["recall_at_10"]["recall"] + 0.2


# ---------------------------------------------------------------------------- add / remove
def test_add_to_flat_equals_a_fresh_build_over_the_union(tmp_path):
    first, second = unit_vectors(3000, 32, seed=1), unit_vectors(1000, 32, seed=2)
    build_index(write_emb(tmp_path / "a", first), tmp_path / "idx", "flat")
    result = add_to_index(tmp_path / "idx", write_emb(tmp_path / "b", second, prefix="new"))
    assert result["count"] == 4000 and result["change"]["first_id"] == 3000
    build_index(write_emb(tmp_path / "union", np.concatenate([first, second])), tmp_path / "fresh", "flat")
    queries = unit_vectors(50, 32, seed=3)
    added, fresh = SearchIndex.load(tmp_path / "idx"), SearchIndex.load(tmp_path / "fresh")
    got_scores, got_ids = added.raw_search(queries, 10)
    ref_scores, ref_ids = fresh.raw_search(queries, 10)
    np.testing.assert_array_equal(got_ids, ref_ids)
    np.testing.assert_allclose(got_scores, ref_scores, atol=1e-6)
    hits = added.search(second[:1], 1)[0]
    assert (hits[0].row, hits[0].path) == (3000, "/photos/new0.jpg")  # the new rows follow the old ids


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_remove_by_ids_and_by_manifest_keeps_the_other_ids(tmp_path, kind):
    vecs = unit_vectors(2000, 32, seed=4)
    build_index(write_emb(tmp_path / "emb", vecs), tmp_path / "idx", kind, nlist=16)
    remove_from_index(tmp_path / "idx", "1,2")
    (tmp_path / "gone.txt").write_text("/photos/img5.jpg\n7\n")
    remove_from_index(tmp_path / "idx", str(tmp_path / "gone.txt"))
    (tmp_path / "gone.jsonl").write_text(json.dumps({"path": "/photos/img9.jpg"}) + "\n")
    result = remove_from_index(tmp_path / "idx", str(tmp_path / "gone.jsonl"))
    assert result["count"] == 1995
    index = SearchIndex.load(tmp_path / "idx")
    assert len(index) == 1995
    top = index.raw_search(vecs[:20], 1)[1][:, 0]
    assert {1, 2, 5, 7, 9}.isdisjoint(top.tolist())
    kept = [i for i in range(20) if i not in (1, 2, 5, 7, 9)]
    assert top[kept].tolist() == kept  # every other vector still finds itself under its own id
    assert index.search(vecs[11:12], 1)[0][0].path == "/photos/img11.jpg"
    with pytest.raises(ConfigError, match=r"1 of 2 entries are not in the index \(first: '1'\)"):
        remove_from_index(tmp_path / "idx", "1,3")  # 1 went already: nothing removed
    assert len(SearchIndex.load(tmp_path / "idx")) == 1995
    with pytest.raises(ConfigError, match="neither a file nor"):
        remove_from_index(tmp_path / "idx", "photos/nowhere.jpg")


def test_remove_from_reranked_ivfpq(tmp_path, collection, ivfpq_pair):
    _, vecs = collection
    shutil.copytree(ivfpq_pair["fp16"][0], tmp_path / "idx")
    remove_from_index(tmp_path / "idx", "0,1,2")
    index = SearchIndex.load(tmp_path / "idx")
    top = index.raw_search(vecs[:6], 1)[1][:, 0]
    assert len(index) == 11_997 and {0, 1, 2}.isdisjoint(top.tolist()) and top[3:].tolist() == [3, 4, 5]


def test_add_refuses_another_model_or_width_in_one_line(tmp_path, capsys):
    build_index(write_emb(tmp_path / "a", unit_vectors(100, 32, seed=5)), tmp_path / "idx", "flat")
    other = write_emb(tmp_path / "other", unit_vectors(10, 32, seed=6), IDENTITY | {"weights_sha256": "b" * 64})
    wide = write_emb(tmp_path / "wide", unit_vectors(10, 48, seed=7))
    for source, message in ((other, "another model than the index's (weights_sha256 differs"),
                            (wide, "holds 48-d vectors, the index 32-d ones")):
        code, _, err = run_cli(["index", str(tmp_path / "idx"), "--add", str(source)], capsys)
        assert code != 0 and err.count("\n") == 1 and message in err, err
    assert len(SearchIndex.load(tmp_path / "idx")) == 100
    code, out, _ = run_cli(["index", str(tmp_path / "idx"), "--add", str(write_emb(
        tmp_path / "more", unit_vectors(5, 32, seed=8))), "--json"], capsys)
    assert code == 0 and json.loads(out)["count"] == 105
    code, out, _ = run_cli(["index", str(tmp_path / "idx"), "--remove", "0,104", "--json"], capsys)
    assert code == 0 and json.loads(out)["count"] == 103 and json.loads(out)["change"]["removed"] == 2
    code, _, err = run_cli(["index", str(tmp_path / "idx"), "--remove", "0"], capsys)  # gone already
    assert code != 0 and err.count("\n") == 1 and "not in the index" in err


@pytest.mark.parametrize("failing", ["index.1.faiss", "manifest.1.jsonl", "index.json"])
def test_a_write_failing_midway_leaves_the_old_index_usable(tmp_path, monkeypatch, failing):
    first = unit_vectors(500, 32, seed=9)
    build_index(write_emb(tmp_path / "a", first), tmp_path / "idx", "flat")
    queries = unit_vectors(5, 32, seed=10)
    before = SearchIndex.load(tmp_path / "idx").search(queries, 5)
    real_replace = os.replace

    def replace(src, dst):  # the atomic writer's commit: fails for one target, as a full disk or a kill would
        if Path(dst).name == failing:
            raise OSError(28, "No space left on device (test)")
        return real_replace(src, dst)

    monkeypatch.setattr(vitkit._files.os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        add_to_index(tmp_path / "idx", write_emb(tmp_path / "b", unit_vectors(100, 32, seed=11)))
    monkeypatch.undo()
    old = SearchIndex.load(tmp_path / "idx")
    assert len(old) == 500 and len(old.rows) == 500 and old.search(queries, 5) == before
    add_to_index(tmp_path / "idx", tmp_path / "b")  # the next update succeeds and clears the orphans
    assert len(SearchIndex.load(tmp_path / "idx")) == 600
    assert sorted(p.name for p in (tmp_path / "idx").iterdir() if not p.name.startswith(".")) == [
        "index.1.faiss", "index.json", "manifest.1.jsonl"]
