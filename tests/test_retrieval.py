"""Retrieval: embed (resumable, sharded, broken files skipped), FAISS indexes, search, dedup and the measures.

Real data and real models: scikit-learn digits and scikit-image photos, the bundled Fashion-MNIST ViT (trained,
so its features are distinct) and tiny random ViTs; FAISS itself; brute force in numpy as the reference."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli
from vitkit.data.images import load_image
from vitkit.data.transforms import eval_transform
from vitkit.errors import ConfigError, DataError
from vitkit.retrieval import Embeddings, SearchIndex, build_index, embed, evaluate, merge, model_identity
from vitkit.retrieval.budget import hnsw_bytes
from vitkit.retrieval.index import DEFAULT_EF_SEARCH, Hit, choose_kind, unwrapped
from vitkit.retrieval.metrics import ann_recall, mean_average_precision, recall_at_k
from vitkit.retrieval.search import hit_captions, score_labels

BUNDLED = "bundled:fashion-mnist"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundled():
    model = vitkit.load_model(BUNDLED)
    model.eval()
    return model


@pytest.fixture(scope="module")
def digits_emb(tmp_path_factory, bundled):
    """All 1,797 digits embedded by the bundled model (trained on Fashion-MNIST: distinct features)."""
    out = tmp_path_factory.mktemp("digits") / "emb"
    embed(bundled, "digits", out, checkpoint=BUNDLED, chunk_size=512, batch_size=256)
    return out


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """skimage photos in class folders, a resized copy of one (a near-duplicate) and a broken file."""
    from skimage import data

    root = tmp_path_factory.mktemp("photos")
    for i, name in enumerate(["astronaut", "coffee", "chelsea", "rocket", "camera"]):
        (root / "ab"[i % 2]).mkdir(exist_ok=True)
        Image.fromarray(getattr(data, name)()).save(root / "ab"[i % 2] / f"{name}.png")
    Image.fromarray(data.astronaut()).resize((120, 120)).save(root / "a" / "astronaut_small.jpg")
    (root / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    return root


def _tiny(img: int = 16, chans: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    return vitkit.create_model("vit_pico_patch2_8", img_size=img, in_chans=chans, depth=1, num_classes=0).eval()


# ---------------------------------------------------------------------------- embed
def test_embed_folder_points_to_originals_and_lists_broken_files(tmp_path, photos):
    model = _tiny()
    meta = embed(model, str(photos), tmp_path / "emb", chunk_size=4, batch_size=3)
    emb = Embeddings(tmp_path / "emb")
    files = sorted(p for p in photos.rglob("*") if p.is_file() and p.name != "broken.jpg")
    assert [r["path"] for r in emb.rows] == [str(p) for p in files]
    assert [r["label"] for r in emb.rows] == [p.parent.name for p in files]
    assert [r["bytes"] for r in emb.rows] == [p.stat().st_size for p in files]
    assert (emb.rows[0]["width"], emb.rows[0]["height"]) == Image.open(files[0]).size
    assert meta["num_skipped"] == 1 and meta["skipped"][0]["path"].endswith("broken.jpg")
    assert "not an image" in meta["skipped"][0]["reason"] or "corrupt" in meta["skipped"][0]["reason"]
    # the stored rows are the model's pooled features of the eval transform, L2-normalised
    tf = eval_transform(model.preprocess)
    x = torch.stack([tf(load_image(p)) for p in files])
    with torch.no_grad():
        ref = torch.nn.functional.normalize(model.forward_head(model.forward_features(x), pre_logits=True), dim=1)
    np.testing.assert_allclose(emb.vectors, ref.numpy(), atol=1e-5)
    assert emb.vectors.shape == (len(files), model.num_features) and meta["model"]["feature"] == "pooled"
    assert not (tmp_path / "emb" / "parts").exists()


def test_embed_manifest_float16_cls_and_patch_tokens(tmp_path, photos):
    model = _tiny()
    files = sorted((photos / "a").glob("*.png"))
    (tmp_path / "list.csv").write_text("path,label\n" + "".join(f"{p},{p.stem}\n" for p in files))
    full = embed(model, str(tmp_path / "list.csv"), tmp_path / "f32")
    half = embed(model, str(tmp_path / "list.csv"), tmp_path / "f16", dtype="float16")
    assert Embeddings(tmp_path / "f16").vectors.dtype == np.float16 and half["count"] == full["count"] == len(files)
    np.testing.assert_allclose(Embeddings(tmp_path / "f16").vectors, Embeddings(tmp_path / "f32").vectors, atol=2e-3)
    assert [r["label"] for r in Embeddings(tmp_path / "f32").rows] == [p.stem for p in files]
    cls = embed(model, str(tmp_path / "list.csv"), tmp_path / "cls", feature="cls", normalize=False)
    patch = embed(model, str(tmp_path / "list.csv"), tmp_path / "patch", feature="patch")
    x = torch.stack([eval_transform(model.preprocess)(load_image(p)) for p in files])
    with torch.no_grad():
        tokens = model.forward_features(x)  # [B, 1 + 64, D]
    np.testing.assert_allclose(Embeddings(tmp_path / "cls").vectors, tokens[:, 0].numpy(), atol=1e-5)
    assert patch["shape"] == [len(files), 64, model.embed_dim] and cls["model"]["normalized"] is False
    with pytest.raises(DataError, match="patch tokens"):
        build_index(tmp_path / "patch", tmp_path / "idx")


def test_embed_refuses_bad_input(tmp_path):
    model = _tiny(8, 1)
    with pytest.raises(DataError, match="no such folder"):
        embed(model, str(tmp_path / "missing"), tmp_path / "e")
    with pytest.raises(ConfigError, match="class token"):
        embed(vitkit.create_model("vit_pico_patch2_8", depth=1, class_token=False, global_pool="avg"), "digits",
              tmp_path / "e", feature="cls")
    embed(model, "digits", tmp_path / "e", split="test")
    with pytest.raises(DataError, match="already holds finished embeddings"):
        embed(model, "digits", tmp_path / "e", split="test")
    # an unfinished run of another model in the folder: refused, not mixed
    (tmp_path / "u" / "parts").mkdir(parents=True)
    plan = json.loads(json.dumps({"source": "digits", "split": "test", "count": 360, "items_sha256": "x",
                                  "dtype": "float32", "chunk_size": 1024, "model": {"weights_sha256": "other"}}))
    (tmp_path / "u" / "parts" / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(DataError, match="unfinished run with another"):
        embed(model, "digits", tmp_path / "u", split="test")
    with pytest.raises(DataError, match="not finished"):
        Embeddings(tmp_path / "u")


def test_sharded_ranks_write_parts_and_rank0_merges(tmp_path):
    """Two ranks into one folder (as torchrun runs them): the merge equals a one-process run, in item order."""
    model = _tiny(8, 1)
    one = embed(model, "digits", tmp_path / "one", split="test", chunk_size=50, batch_size=25)
    part = embed(model, "digits", tmp_path / "two", split="test", chunk_size=50, batch_size=25, rank=1, world_size=2)
    assert part["rank"] == 1 and not (tmp_path / "two" / "meta.json").exists()
    with pytest.raises(DataError, match="not embedded yet"):
        merge(tmp_path / "two")
    two = embed(model, "digits", tmp_path / "two", split="test", chunk_size=50, batch_size=25, rank=0, world_size=2)
    assert two["count"] == one["count"] == one["items"] > 300
    a, b = Embeddings(tmp_path / "one"), Embeddings(tmp_path / "two")
    np.testing.assert_array_equal(a.vectors, b.vectors)
    assert a.rows == b.rows


@pytest.mark.slow
def test_torchrun_two_ranks_then_merge_by_hand(tmp_path):
    """`torchrun --nproc_per_node 2 -m vitkit embed`: each rank writes its chunks, rank 0 merges; the result equals
    a one-process run. `--merge` on the finished folder leaves it as it is."""
    model = _tiny(8, 1)
    vitkit.save_model(model, tmp_path / "m.safetensors")
    embed(model, "digits", tmp_path / "one", split="test", chunk_size=40, batch_size=40)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "vitkit", "embed", str(tmp_path / "m.safetensors"), "digits", "--split", "test",
                           "--out", str(tmp_path / "two"), "--chunk-size", "40", "--batch-size", "40", "--workers",
                           "0", "--quiet"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = Embeddings(tmp_path / "one"), Embeddings(tmp_path / "two")
    assert a.rows == b.rows and b.meta["items"] == len(b)
    np.testing.assert_array_equal(a.vectors, b.vectors)
    assert cli(["embed", "--merge", "--out", str(tmp_path / "two"), "--json"]) == 0
    np.testing.assert_array_equal(Embeddings(tmp_path / "two").vectors, a.vectors)


def test_kill_and_resume_loses_and_duplicates_nothing(tmp_path):
    """SIGKILL a real `vitkit embed` process once a chunk is recorded, rerun the same command: equal to a clean run."""
    model = _tiny(8, 1)
    vitkit.save_model(model, tmp_path / "m.safetensors")
    clean = embed(model, "digits", tmp_path / "clean", chunk_size=64, batch_size=64)
    out = tmp_path / "emb"
    args = ["embed", str(tmp_path / "m.safetensors"), "digits", "--out", str(out), "--chunk-size", "64",
            "--batch-size", "64", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "vitkit", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parts = out / "parts"
    deadline = time.monotonic() + 120
    while not list(parts.glob("0*.json")):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_chunks = -(-1797 // 64)
    assert 1 <= len(list(parts.glob("0*.json"))) < n_chunks and not (out / "meta.json").exists()  # killed mid-run
    assert cli(args) == 0  # the same command again (in this process: one interpreter start less)
    resumed, ref = Embeddings(out), Embeddings(tmp_path / "clean")
    assert resumed.rows == ref.rows and len(resumed) == clean["count"] == 1797
    assert len({r["path"] for r in resumed.rows}) == 1797
    np.testing.assert_array_equal(resumed.vectors, ref.vectors)


# ---------------------------------------------------------------------------- index and search
def test_flat_search_equals_brute_force(tmp_path, digits_emb):
    meta = build_index(digits_emb, tmp_path / "flat", "flat")
    index = SearchIndex.load(tmp_path / "flat")
    vecs = np.asarray(Embeddings(digits_emb).vectors, dtype=np.float64)
    q = vecs[::97]
    sims = q @ vecs.T  # [m, N] cosine (rows are unit vectors)
    ref = np.argsort(-sims, axis=1, kind="stable")[:, :10]
    hits = index.search(q.astype(np.float32), 10)
    got = np.array([[h.row for h in row] for row in hits])
    got_scores = np.array([[h.score for h in row] for row in hits])
    np.testing.assert_allclose(got_scores, np.take_along_axis(sims, ref, 1), atol=1e-5)
    assert (got == ref).mean() > 0.99  # identical ranks, up to exact float ties
    rows = Embeddings(digits_emb).rows
    assert hits[0][0].path == rows[0]["path"] == "digits:train/0" and hits[0][0].label == rows[0]["label"]
    assert meta["model"]["checkpoint"] == BUNDLED and index.model_identity["weights_sha256"]


def test_ann_indexes_recall_stored_params_and_training_size(tmp_path, digits_emb):
    vecs = Embeddings(digits_emb).vectors
    q = np.asarray(vecs[::13], dtype=np.float32)
    exact = np.argsort(-(q @ np.asarray(vecs, dtype=np.float32).T), axis=1, kind="stable")[:, :10]
    with pytest.raises(DataError, match=r"needs at least 6,630 training vectors .* --nlist 46 or fewer"):
        build_index(digits_emb, tmp_path / "ivf", "ivf", nlist=170)  # 39 vectors per list
    with pytest.raises(DataError, match="9,984 for 256-code PQ"):
        build_index(digits_emb, tmp_path / "pq", "ivfpq", nlist=8)
    ivf_meta = build_index(digits_emb, tmp_path / "ivf", "ivf", nlist=32)
    assert ivf_meta["params"] == {"nlist": 32, "nprobe": 8} and ivf_meta["factory"] == "IVF32,Flat"
    ivf = SearchIndex.load(tmp_path / "ivf")
    import faiss

    assert faiss.extract_index_ivf(ivf.index).nprobe == 8  # the stored value, not FAISS's 1
    _, one = ivf.raw_search(q, 10, nprobe=1)
    assert faiss.extract_index_ivf(ivf.index).nprobe == 8  # an override lasts one call
    _, stored = ivf.raw_search(q, 10)
    assert ann_recall(stored, exact) >= 0.9 and ann_recall(stored, exact) >= ann_recall(one, exact)
    build_index(digits_emb, tmp_path / "hnsw", "hnsw")
    hnsw = SearchIndex.load(tmp_path / "hnsw")
    real = (tmp_path / "hnsw" / "index.faiss").stat().st_size
    assert 0.8 < hnsw_bytes(len(vecs), vecs.shape[1]) / real < 1.25  # the size `auto` budgets with
    assert choose_kind(len(vecs), vecs.shape[1]) == "flat" and choose_kind(10**6, 768) == "hnsw"
    assert choose_kind(10**6, 768, max_memory="1GiB") == choose_kind(10**7, 768) == "ivfpq"
    assert unwrapped(hnsw.index).hnsw.efSearch == DEFAULT_EF_SEARCH == 256  # the stored value, not FAISS's 16
    assert ann_recall(hnsw.raw_search(q, 10)[1], exact) >= 0.9


def test_search_cli_images_sheet_identity_and_text(tmp_path, photos, capsys):
    model = _tiny()
    vitkit.save_model(model, tmp_path / "m.safetensors")
    vitkit.save_model(_tiny(seed=1), tmp_path / "other.safetensors")
    ckpt = str(tmp_path / "m.safetensors")
    assert cli(["embed", ckpt, str(photos), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert "broken.jpg" in capsys.readouterr().err
    assert cli(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "flat"  # auto: a small collection is searched exactly
    query = photos / "a" / "astronaut.png"
    assert cli(["search", str(tmp_path / "idx"), str(query), "-k", "3", "--sheet", str(tmp_path / "s.png"),
                "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    top = res["results"][0]["hits"]
    assert top[0]["path"] == str(query) and top[0]["score"] == pytest.approx(1.0, abs=1e-5) and len(top) == 3
    # the resized copy scores 0.99999x: its caption on the sheet must not read as the query's own 1.000
    assert top[1]["path"] == str(photos / "a" / "astronaut_small.jpg") and 0.9999 < top[1]["score"] < 1 - 1e-6
    captions = hit_captions([Hit(h["path"], h["score"], h["label"], h["row"]) for h in top])
    assert captions[0] == "1: 1.000" and len(set(captions)) == 3
    for c, h in zip(captions, top):
        shown = float(c.split(": ")[1])
        decimals = len(c.split(".")[1])
        assert h["score"] - 10**-decimals < shown <= h["score"] + 1e-6  # floored, never rounded up
    assert float(captions[1].split(": ")[1]) < 1
    sheet = Image.open(tmp_path / "s.png")
    assert sheet.width > 3 * 112 and sheet.height >= 112
    assert cli(["search", str(tmp_path / "idx"), str(query), "--model", str(tmp_path / "other.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "another model" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match="another model"):
        SearchIndex.load(tmp_path / "idx").check_identity(model_identity(_tiny(seed=1), None))
    assert cli(["search", str(tmp_path / "idx"), "--text", "an astronaut"]) == 2
    err = capsys.readouterr().err
    assert "--text needs a CLIP model with a text tower" in err and len(err.strip().splitlines()) == 1


def test_dedup_finds_the_resized_copy(tmp_path, photos, capsys):
    model = _tiny()
    embed(model, str(photos), tmp_path / "emb")
    assert cli(["dedup", str(tmp_path / "emb"), "--threshold", "0.995", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    sims = Embeddings(tmp_path / "emb").vectors @ Embeddings(tmp_path / "emb").vectors.T
    n_pairs = int((np.triu(sims, 1) >= 0.995).sum())
    assert n_pairs >= 1  # the resized astronaut at least
    grouped = {p for g in res["groups"] for p in g["paths"]}
    assert str(photos / "a" / "astronaut.png") in grouped and str(photos / "a" / "astronaut_small.jpg") in grouped
    assert res["duplicates"] == sum(len(g["rows"]) - 1 for g in res["groups"])
    assert cli(["dedup", str(tmp_path / "emb"), "--threshold", "2"]) == 2


def _nearest_neighbour_reference(vectors) -> np.ndarray:
    """Each row's best cosine match other than itself, by brute force in float64."""
    x = np.asarray(vectors, dtype=np.float64)
    sims = x @ x.T  # [N, N]
    np.fill_diagonal(sims, -np.inf)
    return sims.max(axis=1)


def test_dedup_prints_nearest_neighbour_similarity_and_warns_below_the_median(tmp_path, capsys):
    """A random tiny ViT maps every digit to nearly the same direction: at 0.95 everything groups, and dedup says
    so, with the collection's own nearest-neighbour similarity to choose a threshold from."""
    embed(_tiny(8, 1), "digits", tmp_path / "emb", split="test")
    nn_ = _nearest_neighbour_reference(Embeddings(tmp_path / "emb").vectors)
    median, p99 = float(np.median(nn_)), float(np.percentile(nn_, 99))
    assert 0.95 < median < p99 < 1  # the weak model the warning is for
    assert cli(["dedup", str(tmp_path / "emb"), "--threshold", "0.95", "--json"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    stats = res["nearest_neighbour_similarity"]
    assert stats["images"] == len(nn_) == 359
    assert stats["median"] == pytest.approx(median, abs=1e-5) and stats["p99"] == pytest.approx(p99, abs=1e-5)
    assert res["duplicates"] > 0.9 * len(nn_)  # most images group, as warned
    warning = out.err.strip().splitlines()
    assert len(warning) == 1 and "below the median nearest-neighbour similarity" in warning[0]
    assert res["warning"] == warning[0]
    # a threshold above the median: the distribution line in the table, no warning
    above = (median + p99) / 2
    assert cli(["dedup", str(tmp_path / "emb"), "--threshold", f"{above:.6f}"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    line = re.search(r"nearest-neighbour similarity: median ([0-9.]+), p99 ([0-9.]+) \((\d+) images\)", out.out)
    assert line, out.out
    shown_median, shown_p99 = float(line[1]), float(line[2])
    assert int(line[3]) == 359 and shown_median != shown_p99
    assert median - 1e-3 < shown_median <= median + 1e-6 and p99 - 1e-3 < shown_p99 <= p99 + 1e-6


def test_nearest_neighbour_excludes_only_the_image_itself(tmp_path, photos):
    """A file listed twice has an exact twin (similarity 1): its best match other than itself is the twin."""
    from vitkit.retrieval.dedup import nearest_neighbour_similarity

    files = sorted((photos / "a").glob("*.png")) + sorted((photos / "b").glob("*.png"))
    (tmp_path / "list.csv").write_text("".join(f"{p}\n" for p in [*files, files[0]]))
    embed(_tiny(), str(tmp_path / "list.csv"), tmp_path / "emb")
    vecs = Embeddings(tmp_path / "emb").vectors
    got = nearest_neighbour_similarity(vecs)
    np.testing.assert_allclose(got, _nearest_neighbour_reference(vecs), atol=1e-5)
    assert got[0] == pytest.approx(1.0, abs=1e-6) and got[1] < 0.9999


def test_score_labels_never_round_up_and_keep_scores_apart():
    close = [1.0, 0.99996, 0.9998, 0.91237, 0.91234, -0.12345]
    labels = score_labels(close)
    assert labels[0].startswith("1.000") and not any(lb.startswith("1.") for lb in labels[1:])
    assert len(set(labels)) == len(close)  # every score distinct
    decimals = len(labels[0].split(".")[1])
    assert decimals == 5  # the fewest that separate 0.91234 from 0.91237
    for lb, s in zip(labels, close):
        assert len(lb.split(".")[1]) == decimals and s - 10**-decimals < float(lb) <= s
    assert score_labels([0.5, 0.25]) == ["0.500", "0.250"]  # three decimals when they suffice
    assert score_labels([1 - 5e-8, 1.0000001]) == ["1.000", "1.000"]  # float32 noise around a self match


# ---------------------------------------------------------------------------- measures
def test_measures_against_independent_definitions(digits_emb):
    from sklearn.metrics import average_precision_score
    from sklearn.neighbors import NearestNeighbors

    emb = Embeddings(digits_emb)
    x = np.asarray(emb.vectors, dtype=np.float64)
    labels = np.array([int(v) for v in emb.labels()])
    q, g = x[:200], x[200:]
    qy, gy = labels[:200], labels[200:]
    res = evaluate(q, [str(v) for v in qy], g, [str(v) for v in gy], ks=(1, 5))
    nn_ = NearestNeighbors(n_neighbors=5, metric="cosine").fit(g)
    idx = nn_.kneighbors(q, return_distance=False)
    for k in (1, 5):
        want = 100 * np.mean([(gy[idx[i, :k]] == qy[i]).any() for i in range(len(q))])
        assert res["recall"][f"R@{k}"] == pytest.approx(want, abs=1e-4)
    want_map = 100 * np.mean([average_precision_score(gy == qy[i], g @ q[i]) for i in range(len(q))])
    assert res["mAP"] == pytest.approx(want_map, abs=0.05)
    assert mean_average_precision(q, torch.tensor(qy), g, torch.tensor(gy)) == pytest.approx(res["mAP"])
    # a model trained on Fashion-MNIST still groups digits well above chance (10%)
    assert res["knn"]["top1"] > 50 and res["recall"]["R@1"] > 50
    assert ann_recall([[1, 2, 3], [4, 5, -1]], [[3, 2, 9], [4, 5, 6]]) == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert recall_at_k(torch.tensor([[1, 0], [0, 0]]), torch.tensor([0, 1]), ks=(1, 2)) == {"R@1": 0.0, "R@2": 50.0}


def test_eval_cli_leave_one_out(tmp_path, digits_emb, capsys):
    build_index(digits_emb, tmp_path / "idx", "hnsw")
    assert cli(["search", str(tmp_path / "idx"), "--eval", "self", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["leave_one_out"] and res["queries"] == 1797
    assert res["ann_recall"]["recall@10"] >= 0.9 and set(res["recall"]) == {"R@1", "R@5", "R@10"}
    assert abs(res["index_recall"]["R@1"] - res["recall"]["R@1"]) < 5
    # the index's own collection given as other embeddings (the folder itself, or a copy of it elsewhere): noticed,
    # and scored leave-one-out like `self`, not the 100% of every query finding itself
    shutil.copytree(digits_emb, tmp_path / "copy")
    for given in (digits_emb, tmp_path / "copy"):
        assert cli(["search", str(tmp_path / "idx"), "--eval", str(given), "--json"]) == 0
        out = capsys.readouterr()
        again = json.loads(out.out)
        assert again["leave_one_out"] and again["recall"] == res["recall"] and again["mAP"] == res["mAP"]
        assert again["recall"]["R@1"] < 100 and again["own_entries_excluded"] == 1797
        note = out.err.strip().splitlines()
        assert len(note) == 1 and "index's own collection" in note[0] and "leave-one-out" in note[0]
    emb_other = tmp_path / "other"
    embed(_tiny(8, 1), "digits", emb_other, split="test")
    assert cli(["search", str(tmp_path / "idx"), "--eval", str(emb_other)]) == 2
    assert "another model" in capsys.readouterr().err


def test_eval_cli_partial_overlap_excludes_each_query_own_entry(tmp_path, photos, capsys):
    """Queries of which some are items of the index's collection: each of those never retrieves its own entry
    (found by path and recorded size), the others search the whole collection; the note says how many."""
    from skimage import data

    model = _tiny()
    vitkit.save_model(model, tmp_path / "m.safetensors")
    ckpt = str(tmp_path / "m.safetensors")
    assert cli(["embed", ckpt, str(photos), "--out", str(tmp_path / "emb"), "--quiet", "--json"]) == 0
    assert cli(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--json"]) == 0
    Image.fromarray(data.coins()).save(tmp_path / "coins.png")
    inside = [photos / "a" / "astronaut.png", photos / "b" / "coffee.png"]
    (tmp_path / "q.csv").write_text(f"{inside[0]},a\n{inside[1]},b\n{tmp_path / 'coins.png'},b\n")
    assert cli(["embed", ckpt, str(tmp_path / "q.csv"), "--out", str(tmp_path / "q"), "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert cli(["search", str(tmp_path / "idx"), "--eval", str(tmp_path / "q"), "--json"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert res["own_entries_excluded"] == 2 and not res["leave_one_out"] and res["queries"] == 3
    note = out.err.strip().splitlines()
    assert len(note) == 1 and "2 of 3" in note[0] and res["note"] == note[0]
    # reference: brute force over the gallery, each query's own file masked out by path
    gallery, queries = Embeddings(tmp_path / "emb"), Embeddings(tmp_path / "q")
    sims = np.asarray(queries.vectors, np.float64) @ np.asarray(gallery.vectors, np.float64).T  # [3, 6]
    for i, r in enumerate(queries.rows):
        sims[i, [j for j, g in enumerate(gallery.rows) if g["path"] == r["path"]]] = -np.inf
    top1 = [gallery.rows[j]["label"] for j in sims.argmax(axis=1)]
    want = 100 * np.mean([a == r["label"] for a, r in zip(top1, queries.rows)])
    assert res["recall"]["R@1"] == pytest.approx(want)
    assert res["index_recall"]["R@1"] == pytest.approx(want)  # the flat index, its own entries dropped too
    assert res["ann_recall"]["recall@10"] == pytest.approx(1.0)


def test_concurrent_searches_with_different_nprobe_each_get_their_own_answer(tmp_path, digits_emb):
    """nprobe/efSearch are per call (FAISS SearchParameters): threads asking for different values at the
    same time must not see each other's, and the shared index keeps its stored values."""
    import faiss

    build_index(digits_emb, tmp_path / "ivf", "ivf", nlist=32)
    ivf = SearchIndex.load(tmp_path / "ivf")
    q = np.asarray(Embeddings(digits_emb).vectors[::7], dtype=np.float32)  # [m, D]
    expected = {p: ivf.raw_search(q, 10, nprobe=p) for p in (1, 32)}  # one at a time: the reference answers
    assert not np.array_equal(expected[1][1], expected[32][1])  # the two settings really answer differently

    def search(nprobe: int) -> bool:
        return all(np.array_equal(ivf.raw_search(q, 10, nprobe=nprobe)[1], expected[nprobe][1]) for _ in range(15))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(search, [1, 32] * 4))
    assert faiss.extract_index_ivf(ivf.index).nprobe == 8  # the stored value, never touched
    build_index(digits_emb, tmp_path / "hnsw", "hnsw")
    hnsw = SearchIndex.load(tmp_path / "hnsw")
    small, stored = hnsw.raw_search(q, 10, ef_search=10)[1], hnsw.raw_search(q, 10)[1]
    assert unwrapped(hnsw.index).hnsw.efSearch == DEFAULT_EF_SEARCH and small.shape == stored.shape == (len(q), 10)
