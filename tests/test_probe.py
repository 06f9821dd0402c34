"""Frozen-feature evaluation (vitkit.probe): the weighted k-NN against a brute-force reference and against a
transcription of facebookresearch/dino's eval_knn.knn_classifier, the linear probe (MAE's BatchNorm without
affine + linear) on real digits features, and `vitkit eval --protocol knn|linear`."""
from __future__ import annotations

import json
import math

import pytest
import torch

from vitkit.cli.main import main as cli
from vitkit.probe import LinearProbe, extract_features, knn_classify, knn_scores, linear_probe


def brute_force_knn(bank, bank_labels, queries, k, T, num_classes, exclude_self=False):
    """One query at a time, in plain Python: cosine similarity to every bank row, the k most similar, and
    per class the sum of exp(sim / T) over those neighbours; the prediction is the class with the largest sum."""
    preds, all_scores = [], []
    for qi, q in enumerate(queries.tolist()):
        qn = math.sqrt(sum(v * v for v in q))
        sims = []
        for bi, b in enumerate(bank.tolist()):
            if exclude_self and bi == qi:
                continue
            bn = math.sqrt(sum(v * v for v in b))
            sims.append((sum(x * y for x, y in zip(q, b)) / (qn * bn), int(bank_labels[bi])))
        sims.sort(key=lambda t: -t[0])
        scores = [0.0] * num_classes
        for sim, label in sims[:k]:
            scores[label] += math.exp(sim / T)
        preds.append(max(range(num_classes), key=lambda c: scores[c]))
        all_scores.append(scores)
    return torch.tensor(preds), torch.tensor(all_scores, dtype=torch.float64)


@torch.no_grad()
def dino_knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes=1000):
    """facebookresearch/dino eval_knn.py knn_classifier (features already L2-normalised)."""
    top1, top5, total = 0.0, 0.0, 0
    train_features = train_features.t()
    num_test_images, num_chunks = test_labels.shape[0], 100
    imgs_per_chunk = num_test_images // num_chunks
    retrieval_one_hot = torch.zeros(k, num_classes).to(train_features.device)
    for idx in range(0, num_test_images, imgs_per_chunk):
        features = test_features[idx: min((idx + imgs_per_chunk), num_test_images), :]
        targets = test_labels[idx: min((idx + imgs_per_chunk), num_test_images)]
        batch_size = targets.shape[0]
        similarity = torch.mm(features, train_features)
        distances, indices = similarity.topk(k, largest=True, sorted=True)
        candidates = train_labels.view(1, -1).expand(batch_size, -1)
        retrieved_neighbors = torch.gather(candidates, 1, indices)
        retrieval_one_hot.resize_(batch_size * k, num_classes).zero_()
        retrieval_one_hot.scatter_(1, retrieved_neighbors.view(-1, 1), 1)
        distances_transform = distances.clone().div_(T).exp_()
        probs = torch.sum(torch.mul(retrieval_one_hot.view(batch_size, -1, num_classes),
                                    distances_transform.view(batch_size, -1, 1)), 1)
        _, predictions = probs.sort(1, True)
        correct = predictions.eq(targets.data.view(-1, 1))
        top1 = top1 + correct.narrow(1, 0, 1).sum().item()
        top5 = top5 + correct.narrow(1, 0, min(5, k)).sum().item()
        total += targets.size(0)
    return top1 * 100.0 / total, top5 * 100.0 / total


def _features(n, d=12, classes=6, seed=0):
    """Clustered random features (so the k-NN is far from chance) with labels."""
    centres = torch.randn(classes, d, generator=torch.Generator().manual_seed(0))  # the same for every call
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    return centres[y] + 1.0 * torch.randn(n, d, generator=g), y


def test_knn_equals_brute_force_and_dino_knn_classifier():
    bank, bank_y = _features(300, seed=1)
    q, q_y = _features(150, seed=2)
    q = q * 3.0  # unnormalised inputs: the protocol normalises them
    for k, T in ((20, 0.07), (5, 0.5), (1, 0.07)):
        res = knn_classify(bank, bank_y, q, q_y, k=k, T=T, num_classes=6, chunk=64)
        ref_pred, ref_scores = brute_force_knn(bank, bank_y, q, k, T, 6)
        assert torch.equal(res["pred"], ref_pred), (k, T)  # every prediction
        assert res["top1"] == pytest.approx(100.0 * (ref_pred == q_y).double().mean().item(), abs=1e-9)
        scores = knn_scores(bank, bank_y, q, k, T, 6).double()
        torch.testing.assert_close(scores, ref_scores, rtol=1e-4, atol=0)
        top1, top5 = dino_knn_classifier(torch.nn.functional.normalize(bank, dim=1), bank_y,
                                         torch.nn.functional.normalize(q, dim=1), q_y, k, T, num_classes=6)
        assert (res["top1"], res["top5"]) == pytest.approx((top1, top5), abs=1e-9), (k, T)
    assert 50 < knn_classify(bank, bank_y, q, q_y, num_classes=6)["top1"] < 100  # clustered: well above 1/6
    # fewer than 100 queries (DINO's chunking divides by zero there) and leave-one-out against brute force
    few, few_y = _features(37, seed=3)
    loo = knn_classify(few, few_y, few, few_y, k=5, T=0.07, num_classes=6, exclude_self=True, chunk=10)
    ref_pred, _ = brute_force_knn(few, few_y, few, 5, 0.07, 6, exclude_self=True)
    assert torch.equal(loo["pred"], ref_pred)
    with_self = knn_classify(few, few_y, few, few_y, k=1, T=0.07, num_classes=6)
    assert with_self["top1"] == 100.0  # without exclusion each query finds itself


@pytest.fixture(scope="module")
def digits_features():
    """Frozen features of a seeded, untrained vit_pico_patch2_8 on the digits train and test splits."""
    from torch.utils.data import DataLoader

    import vitkit
    from vitkit.data.datasets import Transformed, load_data
    from vitkit.data.transforms import eval_transform

    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8")
    data = load_data("digits", seed=0)
    tf = eval_transform(model.preprocess)
    out = [extract_features(model, DataLoader(Transformed(ds, tf, deterministic=False), batch_size=256))
           for ds in (data.train, data.test)]
    assert model.training  # the mode is restored
    return out


def test_linear_probe_on_digits_features_beats_chance_and_is_deterministic(digits_features):
    (tx, ty), (vx, vy) = digits_features
    assert tx.shape == (1438, 96) and vx.shape == (359, 96)
    a = linear_probe(tx, ty, vx, vy, 10, seed=0)  # MAE's 90 epochs (10 of warm-up): cheap on cached features
    b = linear_probe(tx, ty, vx, vy, 10, seed=0)
    c = linear_probe(tx, ty, vx, vy, 10, seed=1)
    assert a["top1"] > 50  # random ViT features are linearly separable far above chance (10%); measured 62%
    assert torch.equal(a["pred"], b["pred"]) and a["top1"] == b["top1"] and a["train_loss"] == b["train_loss"]
    assert c["train_loss"] != a["train_loss"]  # the seed matters
    probe = LinearProbe(96, 10)
    assert not probe.bn.affine and probe.bn.eps == 1e-6 and probe.bn.weight is None
    # the k-NN of the same features also beats chance
    assert knn_classify(tx, ty, vx, vy, num_classes=10)["top1"] > 20  # measured 29.5%


def test_eval_cli_prints_one_line_per_protocol_and_json(tmp_path, capsys):
    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8")
    ckpt = tmp_path / "m.safetensors"
    vitkit.save_model(model, ckpt)
    base = ["eval", str(ckpt), "--data", "digits", "--probe-epochs", "30"]
    assert cli([*base, "--protocol", "knn,linear,top1"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert [ln.split(":")[0] for ln in lines] == ["knn", "linear", "top1"], lines
    assert all("top-1" in ln and "digits test (359 images)" in ln for ln in lines)
    assert "k=20, T=0.07, bank: train (1438 images)" in lines[0]
    assert cli([*base, "--protocol", "knn,linear", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["protocols"] == ["knn", "linear"] and out["split"] == "test" and out["count"] == 359
    assert out["bank_count"] == 1438 and "top1" not in out
    assert 10 < out["knn"]["top1"] <= 100 and 10 < out["linear"]["top1"] <= 100
    assert out["knn"]["k"] == 20 and out["knn"]["T"] == 0.07 and out["linear"]["epochs"] == 30
    assert cli([*base, "--protocol", "knn", "--k", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["knn"]["k"] == 5
    with pytest.raises(SystemExit) as e:
        cli([*base, "--protocol", "cosine"])
    assert e.value.code == 2
    assert "unknown protocol" in capsys.readouterr().err
