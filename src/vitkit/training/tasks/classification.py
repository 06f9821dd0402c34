"""Supervised classification: today's default objective."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import Task


class ClassificationTask(Task):
    """Cross-entropy with label smoothing, in fp32 on the logits; MixUp/CutMix soft targets
    (data.transforms.batch_mixer), switched off for the last `mix_off_epochs` epochs."""

    any_token_count = True
    padded_batches = True

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        from ...data.transforms import batch_mixer

        self.mixer = batch_mixer(recipe, self.num_classes)
        self.mixing = self.mixer is not None

    def on_epoch_start(self, epoch: int) -> None:
        self.mixing = self.mixer is not None and epoch < self.epochs - self.recipe.mix_off_epochs

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """logits [B, K]; target [B] class indices or [B, K] soft targets."""
        return F.cross_entropy(logits.float(), target, label_smoothing=self.recipe.label_smoothing)

    def forward(self, batch) -> dict[str, Any]:
        x, y = batch
        if self.mixing:
            x, y = self.mixer(x, y)  # y: [B, K] soft targets
        with self.autocast():
            logits = self.model(x)
        return {"loss": self.loss(logits, y), "logits": logits, "target": y, "batch_size": len(x)}

    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        from ..evaluate import evaluate

        res = evaluate(model, loader, self.num_classes, self.device, self.recipe.bf16)
        return {"top1": res["top1"], "top5": res["top5"], "loss": res["loss"], "score": res["top1"],
                "confusion": res["confusion"]}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        extra = f" (without EMA {raw['top1']:.2f}%)" if raw else ""
        return f"top-1 {metrics['top1']:.2f}%{extra} top-5 {metrics['top5']:.2f}%"
