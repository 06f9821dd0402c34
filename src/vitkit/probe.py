"""Frozen-feature evaluation of any model: weighted k-NN (DINO's protocol) and a linear probe (MAE's).

Features are the pooled features the classifier would see, `model.forward_head(model.forward_features(x),
pre_logits=True)` (the class token after the final norm for a ViT, the pooled last stage for a ResNet), of
the eval transform (no augmentation), computed once.

- k-NN (facebookresearch/dino `eval_knn.knn_classifier`): features L2-normalised, cosine similarity = dot
  product, the k most similar bank images vote for their class with weight exp(sim / T); k = 20, T = 0.07.
  The bank is the train split, the queries the eval split. DINO's own code chunks the queries by
  N // 100 (a zero step below 100 queries); here chunks have a fixed size, so any number works.
- Linear probe (facebookresearch/mae `main_linprobe.py`): BatchNorm1d(affine=False, eps=1e-6) + Linear
  (weights normal std 0.01, bias 0), cross-entropy, no weight decay, lr = base_lr * batch / 256 with a
  linear warm-up and a cosine decay per iteration. Two simplifications, for speed: the features are computed
  once without augmentation (MAE trains through the frozen encoder on RandomResizedCrop + flip), and the
  optimiser is SGD with momentum 0.9 (MAE's LARS; on one linear layer after a BatchNorm the trust ratio
  only rescales the step). Deterministic for a seed (shuffling and initialisation use their own generator).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .models.features import pooled_features

KNN_K, KNN_T = 20, 0.07


@torch.no_grad()
def extract_features(model: nn.Module, loader, device: torch.device | str = "cpu",
                     bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, D] float32 on the CPU, labels [N] int64) of every image the loader yields ((x, y) batches)."""
    device = torch.device(device)
    was = model.training
    model.eval()
    feats, labels = [], []
    try:
        for batch in loader:
            x, y = batch[0].to(device), batch[1]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                f = pooled_features(model, x)
            feats.append(f.float().cpu())
            labels.append(torch.as_tensor(y).long().cpu())
    finally:
        model.train(was)
    return torch.cat(feats), torch.cat(labels)


def mask_excluded(sim: torch.Tensor, exclude: torch.Tensor) -> None:
    """sim[i, exclude[i]] = -inf in place wherever exclude[i] >= 0 (sim [m, N], exclude [m]): a query never
    retrieves the bank row that is itself."""
    queries = torch.nonzero(exclude >= 0).squeeze(1)  # [q]
    sim[queries, exclude[queries]] = -math.inf


@torch.no_grad()
def knn_scores(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, k: int = KNN_K,
               T: float = KNN_T, num_classes: int | None = None, *, exclude_self: bool = False,
               exclude: torch.Tensor | None = None, normalize: bool = True, chunk: int = 1024) -> torch.Tensor:
    """Class scores [M, C] of the weighted k-NN: for each query, the sum of exp(sim / T) over its k most similar
    bank rows of each class. `exclude_self`: the queries are the bank (same order) and a row never votes for
    itself (leave-one-out). `exclude` [M]: the bank row that never votes for each query (-1: none), for queries
    that are only partly in the bank. `normalize`: L2-normalise both sides first (the protocol does)."""
    bank, queries = bank.float(), queries.float()
    if normalize:
        bank, queries = F.normalize(bank, dim=1), F.normalize(queries, dim=1)
    C = int(num_classes if num_classes is not None else int(bank_labels.max()) + 1)
    k = min(k, len(bank) - int(exclude_self or exclude is not None))
    if k < 1:
        raise ValueError("the k-NN bank is empty")
    out = torch.empty(len(queries), C)
    for i in range(0, len(queries), chunk):
        sim = queries[i:i + chunk] @ bank.T  # [m, N]
        if exclude_self:
            rows = torch.arange(sim.shape[0])
            sim[rows, rows + i] = -math.inf
        if exclude is not None:
            mask_excluded(sim, exclude[i:i + chunk])
        top, idx = sim.topk(k, dim=1, largest=True, sorted=True)
        votes = torch.zeros(sim.shape[0], C)
        votes.scatter_add_(1, bank_labels[idx], (top / T).exp())
        out[i:i + chunk] = votes
    return out


def knn_classify(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor,
                 query_labels: torch.Tensor | None = None, k: int = KNN_K, T: float = KNN_T,
                 num_classes: int | None = None, **kw) -> dict[str, Any]:
    """Predictions [M] (and, with query labels, top-1 / top-5 in %) of the weighted k-NN (see knn_scores)."""
    if num_classes is None:
        num_classes = int(max(bank_labels.max(), query_labels.max() if query_labels is not None else 0)) + 1
    scores = knn_scores(bank, bank_labels, queries, k, T, num_classes, **kw)
    order = scores.argsort(dim=1, descending=True, stable=True)
    out: dict[str, Any] = {"pred": order[:, 0], "k": k, "T": T, "count": len(queries)}
    if query_labels is not None:
        hit = order[:, :min(5, k, num_classes)] == query_labels.view(-1, 1)  # at most k classes have votes
        out["top1"] = 100.0 * int(hit[:, 0].sum()) / len(queries)
        out["top5"] = 100.0 * int(hit.any(dim=1).sum()) / len(queries)
    return out


class LinearProbe(nn.Module):
    """MAE's probe head: BatchNorm1d without affine (eps 1e-6), then Linear."""

    def __init__(self, dim: int, num_classes: int, generator: torch.Generator | None = None):
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, affine=False, eps=1e-6)
        self.fc = nn.Linear(dim, num_classes)
        with torch.no_grad():
            # MAE: timm's trunc_normal_(std=0.01), cut at +-2 (200 std): a plain normal
            self.fc.weight.copy_(torch.randn(num_classes, dim, generator=generator) * 0.01)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(x))


def fit_minibatches(opt: torch.optim.Optimizer, n: int, batch_size: int, epochs: int, generator: torch.Generator,
                    lr_at, loss_of) -> torch.Tensor:
    """`epochs` passes over n rows in seeded random full batches (all n rows as one batch when n < batch_size:
    BatchNorm wants more than one row), the lr set to `lr_at(step, total_steps)` before each step and
    `loss_of(rows)` minimised; -> the last loss. The loop of the linear probes (pooled and dense)."""
    per_epoch = max(1, n // batch_size)
    total, it = epochs * per_epoch, 0
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        for b in range(per_epoch):
            idx = perm[b * batch_size:(b + 1) * batch_size] if n >= batch_size else perm
            for group in opt.param_groups:
                group["lr"] = lr_at(it, total)
            loss = loss_of(idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1
    return loss


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor | None,
                 num_classes: int, *, epochs: int = 90, batch_size: int = 256, base_lr: float = 0.1,
                 warmup_epochs: int = 10, momentum: float = 0.9, seed: int = 0) -> dict[str, Any]:
    """Train the probe on frozen train features, predict the test features: {"pred", "top1", "top5", ...}."""
    g = torch.Generator().manual_seed(seed)
    train_x, test_x = train_x.float(), test_x.float()
    probe = LinearProbe(train_x.shape[1], num_classes, g)
    opt = torch.optim.SGD(probe.parameters(), lr=0.0, momentum=momentum, weight_decay=0.0)
    lr = base_lr * batch_size / 256
    n = len(train_x)
    warm = min(warmup_epochs, epochs) * max(1, n // batch_size)

    def lr_at(it: int, total: int) -> float:  # linear warm-up, then cosine decay
        return lr * (it / warm if it < warm else 0.5 * (1 + math.cos(math.pi * (it - warm) / max(total - warm, 1))))

    loss = fit_minibatches(opt, n, batch_size, epochs, g, lr_at,
                           lambda idx: F.cross_entropy(probe(train_x[idx]), train_y[idx]))
    probe.eval()
    with torch.no_grad():
        logits = probe(test_x)
    out: dict[str, Any] = {"pred": logits.argmax(1), "epochs": epochs, "lr": lr, "train_loss": loss.item(),
                           "count": len(test_x)}
    if test_y is not None:
        top = logits.topk(min(5, num_classes), dim=1).indices == test_y.view(-1, 1)
        out["top1"] = 100.0 * int(top[:, 0].sum()) / len(test_x)
        out["top5"] = 100.0 * int(top.any(dim=1).sum()) / len(test_x)
    return out


PROTOCOLS = ("top1", "knn", "linear")


def probe_on(model, data: str, protocols: list[str] | tuple[str, ...] = ("knn", "linear"), *,
             split: str | None = None, seed: int = 0, val_fraction: float = 0.0, batch_size: int = 256,
             strict: bool = False, k: int = KNN_K, T: float = KNN_T, epochs: int = 90,
             probe_seed: int = 0, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Frozen-feature results of `model` on `data` (digits | fashion-mnist | FOLDER | MANIFEST.csv): the train
    split is the k-NN bank and the probe's training set; `split` (default test, else val) the queries.
    Returns {"data", "split", "count", "bank_count", "knn": {...}, "linear": {...}} for the protocols asked."""
    from .data.datasets import eval_loader, load_eval_split
    from .errors import DataError

    if split in ("train", "all"):
        raise DataError("frozen-feature evaluation queries the test or val split (the train split is the bank)")
    # the data's own labels: the probes are fitted on them, whatever classes the model's head has
    ds_all, split, queries = load_eval_split(data, channels=int(model.preprocess.input_size[0]), split=split,
                                             seed=seed, val_fraction=val_fraction, strict=strict, options=options)
    if split == "all":  # eval_split's default for data that was never split: nothing held out to query
        raise DataError(f"frozen-feature evaluation needs a train split (the bank) and a separate eval split; "
                        f"{data} has no test or val split")

    def feats(ds):
        return extract_features(model, eval_loader(ds, model.preprocess, batch_size=batch_size))

    bank_x, bank_y = feats(ds_all.train)
    q_x, q_y = feats(queries)
    C = len(ds_all.class_names)
    out: dict[str, Any] = {"data": ds_all.name, "split": split, "count": len(q_x), "bank_split": "train",
                           "bank_count": len(bank_x), "feature_dim": int(bank_x.shape[1])}
    if "knn" in protocols:
        r = knn_classify(bank_x, bank_y, q_x, q_y, k=k, T=T, num_classes=C)
        out["knn"] = {"top1": r["top1"], "top5": r["top5"], "k": k, "T": T}
    if "linear" in protocols:
        r = linear_probe(bank_x, bank_y, q_x, q_y, C, epochs=epochs, seed=probe_seed)
        out["linear"] = {"top1": r["top1"], "top5": r["top5"], "epochs": epochs, "lr": r["lr"],
                         "seed": probe_seed}
    return out
