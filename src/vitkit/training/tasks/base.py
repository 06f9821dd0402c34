"""Training objectives. The loop knows nothing about what is learnt; per micro-batch it does

    out = task(batch)                               # batch: what the DataLoader yields, on the device
    (out["loss"] / accum_steps).backward()

and per epoch `task.evaluate(model, loader)`, whose "score" picks best.safetensors. timm's `timm/task`
(TrainingTask) is the precedent: the objective is an object that wraps the (possibly DDP-wrapped) model.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...errors import ConfigError


class Task:
    """An objective. A new one (MAE, DeiT distillation, DINO) subclasses Task, adds itself to `TASKS`, and
    implements:

    - `__call__(batch) -> dict`: "loss", a scalar tensor (the micro-batch mean), plus anything else it likes;
      "batch_size" (images in the micro-batch) when `batch[0]` is not the image tensor. It runs `self.net`
      (the model as trained: DDP-wrapped and compiled when asked) under `self.autocast()`.
    - `evaluate(model, loader) -> dict`: metrics with "score" (higher is better: it picks best.safetensors;
      an MAE returns -loss) and "loss". The other numbers are logged as eval_<name>; other values (a
      confusion matrix) only reach the report.

    and, when it needs them (the defaults do nothing):

    - `on_train_start(total_steps, steps_per_epoch)`: the length of the run (DINO's momentum schedule);
    - `on_epoch_start(epoch)`: a schedule over epochs (MixUp off for the last epochs, DINO's teacher temperature);
    - `after_step(step)`: after each optimiser step (DINO's teacher EMA update);
    - `modules()`: trainable modules besides the model (MAE's decoder, DINO's head); the optimiser trains them
      and the loop averages their gradients across ranks;
    - `state_dict()` / `load_state_dict()`: tensors kept in state.safetensors for --resume (a DINO teacher,
      its centre); a frozen teacher loaded from a file needs none;
    - `describe(metrics)`: the metrics as the per-epoch console line shows them;
    - `figures(model, dataset, folder)`: PNG files for the run report (MAE's reconstructions), by title;
    - `checkpoints(provenance)`: models besides the trained one that the run folder keeps as vitkit
      checkpoints, by file name, each with its provenance (the run's, as last.safetensors has it, adapted);
      DINO's EMA teacher: teacher.safetensors. Written by `RunDir.save_task_checkpoints`.
    """

    def __init__(self, recipe, *, net: nn.Module, model: nn.Module, num_classes: int, device: torch.device):
        self.recipe, self.net, self.model = recipe, net, model
        self.num_classes, self.device = num_classes, device

    def with_every_parameter(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` plus every model parameter times 0, under DDP: an objective that trains on tokens or features
        (MAE, DINO) leaves the classifier (and for MAE the pooling norm) unused, and DDP waits for a gradient of
        every parameter each step. find_unused_parameters would do too, but refuses several forwards per step
        (DINO's crops); the zero term costs one pass over the weights."""
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return loss
        return loss + 0.0 * sum(p.sum() for p in self.model.parameters() if p.requires_grad)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.recipe.bf16)

    def __call__(self, batch) -> dict[str, Any]:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        raise NotImplementedError

    def on_train_start(self, total_steps: int, steps_per_epoch: int) -> None:
        pass

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def modules(self) -> list[nn.Module]:
        return []

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        if sd:
            raise ConfigError(f"task {type(self).__name__} keeps no state, but the saved state has {sorted(sd)[:3]}")

    def figures(self, model: nn.Module, dataset, folder) -> dict[str, Any]:
        return {}

    def checkpoints(self, provenance: dict[str, Any]) -> dict[str, tuple[nn.Module, dict[str, Any]]]:
        return {}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        text = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float)) and k != "score")
        return text + (f" (without EMA: score {raw['score']:.4g})" if raw else "")


def loggable(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The loggable metrics of a task's evaluation (numbers; "score" is kept apart: it picks the best)."""
    return {prefix + k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "score"}


def to_device(batch, device: torch.device):
    """The tensors of a batch (nested in tuples, lists, dicts) on the device."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
