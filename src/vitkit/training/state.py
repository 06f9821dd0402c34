"""The resumable training state as ONE safetensors file: every tensor (model, EMA, optimiser moments, RNG,
the task's own state)
under a prefixed key, and everything else (epoch, step, optimiser hyper-parameters, history) as a JSON
index in the metadata. No pickle; written atomically, so a crash or a full disk keeps the previous state.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from .budget import Plan

STATE_VERSION = 1


def optimizer_to_flat(opt_state: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """optimizer.state_dict() -> (tensors keyed 'optim.{param}.{name}', JSON-able rest)."""
    tensors, scalars = {}, {}
    for pid, st in opt_state["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{pid}.{k}"] = v
            else:
                scalars.setdefault(str(pid), {})[k] = v
    return tensors, {"param_groups": opt_state["param_groups"], "scalars": scalars}


def optimizer_from_flat(tensors: dict[str, torch.Tensor], index: dict[str, Any]) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        if key.startswith("optim."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    for pid, extra in index.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(extra)
    return {"state": state, "param_groups": index["param_groups"]}


def save_state(path: str | os.PathLike, *, model_sd: dict, optimizer: torch.optim.Optimizer,
               ema_sd: dict | None, info: dict[str, Any], task_sd: dict | None = None) -> Path:
    from safetensors.torch import save_file

    from .._files import atomic_path

    opt_tensors, opt_index = optimizer_to_flat(optimizer.state_dict())
    tensors = {f"model.{k}": v for k, v in model_sd.items()}
    tensors |= {f"ema.{k}": v for k, v in (ema_sd or {}).items()}
    tensors |= {f"task.{k}": v for k, v in (task_sd or {}).items()}
    tensors |= opt_tensors
    tensors["rng.torch"] = torch.get_rng_state()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    meta = {"vitkit.train_state_version": str(STATE_VERSION), "vitkit.optimizer": json.dumps(opt_index),
            "vitkit.info": json.dumps(info, default=str)}
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """-> {'model': sd, 'ema': sd or None, 'task': sd (maybe empty), 'optimizer': optimizer state_dict,
    'rng': tensor, 'info': dict}."""
    from ..weights.io import read_safetensors

    path = Path(path)
    tensors, meta = read_safetensors(path)
    if "vitkit.train_state_version" not in meta:
        raise CheckpointError(f"{path}: not a vitkit training state")
    model = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    ema = {k[4:]: v for k, v in tensors.items() if k.startswith("ema.")} or None
    task = {k[5:]: v for k, v in tensors.items() if k.startswith("task.")}
    return {"model": model, "ema": ema, "task": task, "rng": tensors.get("rng.torch"),
            "optimizer": optimizer_from_flat(tensors, json.loads(meta["vitkit.optimizer"])),
            "info": json.loads(meta["vitkit.info"])}


def _fresh_partial() -> dict[str, float]:
    return {"loss_sum": 0.0, "count": 0, "seen": 0, "time": 0.0}


@dataclass
class Progress:
    """Where a run is (kept in state.safetensors' info for --resume): the epoch and step, the epoch records,
    the best so far, the current epoch's running sums and the wall time of the processes before this one."""

    epoch: int = 0
    batch_in_epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=lambda: {"epoch": 0})
    partial: dict[str, float] = field(default_factory=_fresh_partial)
    wall_time_s: float = 0.0
    plan: Plan | None = None  # a time-budget run's plan (budget.py)

    def add_step(self, loss: float, images: int, seconds: float) -> None:
        p = self.partial
        self.step, self.batch_in_epoch = self.step + 1, self.batch_in_epoch + 1
        p["loss_sum"], p["count"] = p["loss_sum"] + loss, p["count"] + 1
        p["seen"], p["time"] = p["seen"] + images, p["time"] + seconds

    def close_epoch(self, lr: float) -> dict[str, Any]:
        """The epoch's record (training numbers; the loop adds the evaluation's), and the next epoch begun."""
        p = self.partial
        rec = {"epoch": self.epoch + 1, "step": self.step, "train_loss": p["loss_sum"] / max(p["count"], 1),
               "lr": lr, "img_per_s": p["seen"] / max(p["time"], 1e-9), "train_time_s": p["time"],
               "step_time_s": p["time"] / max(p["count"], 1)}
        self.history.append(rec)
        self.epoch, self.batch_in_epoch, self.partial = self.epoch + 1, 0, _fresh_partial()
        return rec

    def info(self, wall_time_s: float, recipe: str) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step,
                "history": self.history, "best": self.best, "partial": self.partial, "wall_time_s": wall_time_s,
                "recipe": recipe, "plan": asdict(self.plan) if self.plan else None}

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Progress:
        plan = Plan(**info["plan"]) if info.get("plan") else None
        return cls(**{k: info[k] for k in ("epoch", "batch_in_epoch", "step", "history", "best", "partial",
                                            "wall_time_s")}, plan=plan)
