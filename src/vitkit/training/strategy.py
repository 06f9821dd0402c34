"""How the trained module (the task: model + heads) runs over processes: one process, DDP replicas, or FSDP
shards. The loop asks the strategy to wrap the task, to skip gradient sync on accumulation micro-batches, for
the whole weights at an epoch's end, and to save and load the resumable state; it never branches on which."""
from __future__ import annotations

import copy
import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .distributed import Dist

STRATEGIES = ("ddp", "fsdp")  # for more than one process; one process is always Single


class Single:
    """One process: the task as it is."""

    name: str | None = None

    def __init__(self, d: Dist, device: torch.device):
        self.d, self.device = d, device

    def threads(self, asked: int | None) -> int | None:
        """torch threads per process: as asked, else (None) torch's default; ranks on one CPU share its cores."""
        if asked or self.d.world == 1 or self.device.type != "cpu":
            return asked or None
        return max(1, (os.cpu_count() or 2) // int(os.environ.get("LOCAL_WORLD_SIZE", self.d.world)))

    def wrap(self, task: nn.Module) -> nn.Module:
        self.task = task
        return task

    def no_sync(self, net: nn.Module, last_micro_batch: bool) -> AbstractContextManager:
        return nullcontext()

    def after_backward(self) -> None:
        """The gradients now hold the mean over all ranks' micro-batches."""

    def gather(self, optimizer) -> tuple[dict, dict] | None:
        """Every rank calls it at an epoch's end: the whole state on rank 0 where it is sharded, else None."""
        return None

    def eval_model(self, default: nn.Module) -> nn.Module:
        """The model rank 0 evaluates and saves: `default` (the model or its EMA) unless sharded."""
        return default

    def saved(self, optimizer, gathered: tuple[dict, dict] | None) -> tuple[dict, Any]:
        """(model state dict, something with `state_dict()` for the optimiser) to write in state.safetensors;
        `gathered`: what `gather` returned (every rank calls `gather` before rank 0 saves)."""
        return self.task.model.state_dict(), optimizer

    def load(self, optimizer, model_sd: dict, optim_sd: dict) -> None:
        self.task.model.load_state_dict(model_sd)
        optimizer.load_state_dict(optim_sd)


class Ddp(Single):
    """Replicas under torchrun: DDP averages the gradients of the whole task (model and heads) each step."""

    name = "ddp"

    def wrap(self, task: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        self.task = task
        return DistributedDataParallel(task, device_ids=[self.d.local_rank] if self.device.type == "cuda" else None,
                                       find_unused_parameters=not task.every_parameter_used)

    def no_sync(self, net: nn.Module, last_micro_batch: bool) -> AbstractContextManager:
        return nullcontext() if last_micro_batch else net.no_sync()


class Fsdp(Single):
    """Shards (training/fsdp.py): parameters, gradients and AdamW state split over the ranks. Rank 0 keeps a
    whole replica of the model for evaluation and checkpoints, loaded with the gathered weights each epoch."""

    name = "fsdp"

    def wrap(self, task: nn.Module) -> nn.Module:
        from . import fsdp

        fsdp.check_recipe(task.recipe)
        self.task = task
        self.plain = copy.deepcopy(task.model).eval() if self.d.main else None
        self.divisor = fsdp.gradient_divisor(self.device, self.d.world, task.recipe.bf16)
        return fsdp.shard(task, self.device, self.d.world, task.recipe.bf16)

    def after_backward(self) -> None:
        from .fsdp import divide_grads

        divide_grads(self.task, self.divisor)  # a backend that summed instead of averaging (fsdp.py)

    def gather(self, optimizer) -> tuple[dict, dict]:
        from .fsdp import full_state

        task_sd, optim_sd = full_state(self.task, optimizer)
        model_sd = {k[len("model."):]: v for k, v in task_sd.items() if k.startswith("model.")}
        if self.plain is not None:
            self.plain.load_state_dict(model_sd)
        return model_sd, optim_sd

    def eval_model(self, default: nn.Module) -> nn.Module:
        return self.plain if self.plain is not None else default

    def saved(self, optimizer, gathered: tuple[dict, dict] | None) -> tuple[dict, Any]:
        from .fsdp import SavedOptimizer

        model_sd, optim_sd = gathered  # every rank took part in the gather
        return model_sd, SavedOptimizer(optim_sd)

    def load(self, optimizer, model_sd: dict, optim_sd: dict) -> None:
        from .fsdp import load_full_state

        if self.plain is not None:  # first: loading into the sharded model turns the dict's tensors into shards
            self.plain.load_state_dict(model_sd)
        load_full_state(self.task, optimizer, {f"model.{k}": v for k, v in model_sd.items()}, optim_sd)


def make_strategy(name: str, d: Dist, device: torch.device) -> Single:
    if name not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    if d.world == 1:
        return Single(d, device)
    return {"ddp": Ddp, "fsdp": Fsdp}[name](d, device)
