"""Training objectives. A task is an nn.Module: the one trainable module of a run, the model being trained
(`task.model`, what the run saves) plus the objective's own heads (MAE's decoder, DINO's head, a segmentation
head). The loop wraps it whole in DDP or FSDP (training/strategy.py) and, per micro-batch, does

    out = net(batch)                                # net: the task, wrapped; batch on the device
    (out["loss"] / accum_steps).backward()

and per epoch `task.evaluate(model, loader)`, whose "score" picks best.safetensors. So train/eval modes,
gradient sync across processes and the state for --resume come from nn.Module, DDP and FSDP, not from each
task. Frozen models (a distillation teacher, DINO's EMA teacher) are held outside the trained module
(`Task.hold`): never trained, never wrapped, never in `state_dict()`. timm's `timm/task` (TrainingTask, an
nn.Module that owns the model and its loss) is the precedent.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

EXTRA = "_extra_state"  # nn.Module's key for get_extra_state()


class Task(nn.Module):
    """An objective. A new one subclasses Task, adds itself to `TASKS`, builds its heads as submodules in
    `__init__` and implements:

    - `forward(batch) -> dict`: "loss", a scalar tensor (the micro-batch mean), plus anything else it likes;
      "batch_size" (images in the micro-batch) when `batch[0]` is not the image tensor. It runs `self.model`
      under `self.autocast()`.
    - `evaluate(model, loader) -> dict`: metrics with "score" (higher is better: it picks best.safetensors;
      an MAE returns -loss) and "loss", for `model` (the weights evaluated: the trained model, its EMA, or a
      checkpoint) with the task's heads. The loop puts the task and `model` in eval mode first. The other
      numbers are logged as eval_<name>; other values (a confusion matrix) only reach the report.

    and, when it needs them (the defaults do nothing):

    - `every_parameter_used = False` when the loss leaves some of the model's parameters without a gradient
      (MAE and DINO never use the classifier): DDP then looks for them each step;
    - `on_train_start(total_steps, steps_per_epoch)`, `on_epoch_start(epoch)`, `after_step(step)`: schedules
      (DINO's momentum and teacher temperature, MixUp off for the last epochs) and updates after each
      optimiser step (DINO's teacher EMA);
    - `held_state()`: the frozen modules held outside whose weights still change (DINO's EMA teacher), by
      name: the loop keeps them in state.safetensors; a teacher loaded from a file needs none;
    - `get_extra_state()` / `set_extra_state()` (nn.Module's): state that is not a parameter or buffer, as a
      dict of tensors (DINO's step, a distillation teacher's logits cache);
    - `checkpoints(provenance)`: models besides the trained one that the run folder keeps as vitkit
      checkpoints, by file name, each with its provenance (DINO's teacher: teacher.safetensors); the loop
      writes them with last.safetensors and at the end of the run;
    - `describe(metrics)`: the metrics as the per-epoch console line shows them;
    - `figures(model, dataset, folder)`: files for the run report (MAE's reconstructions), by title.
    """

    every_parameter_used = True
    any_token_count = False  # the loss works whatever the patch grid (FlexiViT's random patch sizes, flexi.py)
    padded_batches = False  # takes images of different grids as one padded PatchBatch (NaFlex, token_budget.py)

    def __init__(self, recipe, model: nn.Module, *, num_classes: int, device: torch.device):
        super().__init__()
        self.recipe, self.model = recipe, model
        self.num_classes, self.device = num_classes, device
        self.epochs = recipe.epochs  # the run's length; a time budget's plan changes it (the loop sets it)

    @classmethod
    def runs_first(cls, recipe) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        """Runs the objective needs before it starts, by task option: {option: (preset, run folder, --set
        overrides)}. training/pipeline.py trains or finds each, then sets the option to its best.safetensors
        (a distillation teacher given as recipe:NAME)."""
        return {}

    def hold(self, name: str, module: nn.Module) -> nn.Module:
        """Keep `module` as attribute `name` without registering it: a frozen model outside the trained one."""
        object.__setattr__(self, name, module)
        return module

    def heads(self) -> list[nn.Module]:
        """The task's own submodules (trained with the model, in the optimiser after the model's groups)."""
        return [m for m in self.children() if m is not self.model]

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.recipe.bf16)

    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        raise NotImplementedError

    def on_train_start(self, total_steps: int, steps_per_epoch: int) -> None:
        pass

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def held_state(self) -> dict[str, nn.Module]:
        return {}

    def figures(self, model: nn.Module, dataset, folder) -> dict[str, Any]:
        return {}

    def checkpoints(self, provenance: dict[str, Any]) -> dict[str, tuple[nn.Module, dict[str, Any]]]:
        return {}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        text = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float)) and k != "score")
        return text + (f" (without EMA: score {raw['score']:.4g})" if raw else "")

    # -- the state the loop keeps for --resume (the model's own weights are saved apart, as last.safetensors)
    def resume_state(self) -> dict[str, torch.Tensor]:
        """Heads, buffers, extra state and held modules as flat tensors (`model.*` left out)."""
        sd = {k: v for k, v in self.state_dict().items() if not k.startswith("model.")}
        flat = {}
        for k, v in sd.items():
            if k.endswith(EXTRA):  # a dict of tensors: one key each
                flat |= {f"{k}.{name}": t for name, t in v.items()}
            else:
                flat[k] = v
        for name, module in self.held_state().items():
            flat |= {f"{name}.{k}": v for k, v in module.state_dict().items()}
        return flat

    def load_resume_state(self, flat: dict[str, torch.Tensor]) -> None:
        from ...errors import ConfigError

        held = self.held_state()
        own, parts, extras = {}, {name: {} for name in held}, {}
        for k, v in flat.items():
            head, _, rest = k.partition(".")
            if head in parts:
                parts[head][rest] = v
            elif EXTRA in k:
                key, _, name = k.partition(EXTRA + ".")
                extras.setdefault(key + EXTRA, {})[name] = v
            else:
                own[k] = v
        for key in self.state_dict():  # an empty extra state was saved as no tensors at all
            if key.endswith(EXTRA):
                extras.setdefault(key, {})
        missing, unexpected = self.load_state_dict(own | extras, strict=False)
        missing = [k for k in missing if not k.startswith("model.")] + [n for n in held if not parts[n]]
        if missing or unexpected:
            raise ConfigError(f"the saved state is not a {type(self).__name__} run's: it lacks {sorted(missing)[:3]}"
                              + (f" and has {sorted(unexpected)[:3]}" if unexpected else ""))
        for name, module in held.items():
            module.load_state_dict(parts[name])


def refuse_moving_augmentation(recipe, task: str, target: str) -> None:
    """Random geometric augmentation (RandomResizedCrop, padding crops, flips, RandAugment) moves the image but not
    a dense target (a mask, boxes): refused in one line naming the switches that turn it off."""
    from ...errors import ConfigError

    moves = [m for m, on in (("crop=rrc", recipe.crop == "rrc"), ("crop=pad", recipe.crop == "pad" and recipe.crop_padding),
                             (f"hflip={recipe.hflip}", recipe.hflip),
                             (f"auto_augment={recipe.auto_augment}", recipe.auto_augment)) if on]
    if moves:
        raise ConfigError(f"task={task}: {', '.join(moves)} would move the image but not its {target}; run with "
                          "--set crop=none --set hflip=0 --set auto_augment=none")


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
    if hasattr(batch, "to"):  # a PatchBatch (layers/naflex.py)
        return batch.to(device, non_blocking=True)
    return batch
