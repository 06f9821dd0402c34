"""Evaluation: top-1/top-5, loss, confusion matrix and per-class precision/recall."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, loader, num_classes: int, device: torch.device, bf16: bool = False) -> dict[str, Any]:
    was_training = model.training
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)  # [true, predicted]
    n = correct1 = correct5 = 0
    loss_sum = 0.0
    k = min(5, num_classes)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        logits = logits.float()  # [B, K]
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        topk = logits.topk(k, dim=1).indices  # [B, k]
        hit = topk == y[:, None]
        correct1 += hit[:, 0].sum().item()
        correct5 += hit.any(dim=1).sum().item()
        n += len(y)
        confusion += torch.bincount(y.cpu() * num_classes + topk[:, 0].cpu(),
                                    minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    model.train(was_training)
    n = max(n, 1)
    return {"top1": 100.0 * correct1 / n, "top5": 100.0 * correct5 / n, "loss": loss_sum / n, "count": n,
            "confusion": confusion}


def per_class(confusion: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
    """Precision, recall and support per class from a [true, predicted] confusion matrix."""
    tp = confusion.diag().double()
    predicted, actual = confusion.sum(0).double(), confusion.sum(1).double()
    out = []
    for i, name in enumerate(class_names):
        prec = (tp[i] / predicted[i]).item() if predicted[i] else 0.0
        rec = (tp[i] / actual[i]).item() if actual[i] else 0.0
        out.append({"class": name, "precision": 100 * prec, "recall": 100 * rec, "support": int(actual[i])})
    return out
