"""The run folder: config.json, metrics.jsonl and steps.jsonl, state.safetensors, last/best.safetensors,
summary.json and the report. Only the main rank writes; every write is atomic (a temp file renamed over the
target), so a kill at any moment leaves each file whole, and `reconcile` makes the logs agree with the saved
state when a run resumes after a kill.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from .._files import atomic_write_text, remove_stale_temps_in
from ..errors import VitkitError
from . import models as model_io
from .state import load_state, save_state


class TrainingError(VitkitError):
    """Training stopped on purpose: a diverged loss, or a checkpoint that could not be written."""


# what a run writes into its folder (a fresh run replaces these; other files there are left alone)
RUN_FILES = ("config.json", "metrics.jsonl", "steps.jsonl", "state.safetensors", "last.safetensors",
             "best.safetensors", "summary.json", "report.md", "curves.png", "confusion.png",
             "teacher.safetensors")  # the last: a task's own checkpoint (Task.checkpoints, DINO's teacher)


def _write_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError  # wraps the OS error (disk full, file too large)

        return (OSError, SafetensorError)
    except ImportError:
        return (OSError,)


_WRITE_ERRORS = _write_errors()


def _reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e)


def _jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def run_config(recipe, data, model, *, command: str, finetune, world: int, device) -> dict[str, Any]:
    """config.json: the resolved recipe, the data (with its seeded split), the model and the environment."""
    from .._version import __version__

    return {"recipe": recipe.to_dict(), "command": command, "finetune": finetune,
            "data": data.summary() | {"split_indices": data.info.get("split_indices")},
            "family": model.family, "model": model.cfg.to_dict(),
            "preprocess": model.preprocess.to_dict(), "class_names": data.class_names,
            "world_size": world, "device": str(device), "vitkit": __version__, "torch": torch.__version__}


def provenance(recipe, dataset: str, epoch: int, split: str, metrics: dict[str, Any], command: str) -> dict[str, Any]:
    """What a checkpoint records about the run that made it; `accuracy` holds the task's metrics but the loss."""
    import time

    from .._version import __version__

    scores = {f"{split}_{k}": round(v, 3) for k, v in metrics.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("loss", "score")}
    based_on = {"based_on": recipe.based_on} if getattr(recipe, "based_on", "") else {}
    # seed and val_fraction let `vitkit eval --split val` carve the same validation split again
    arch_args = {"model_args": dict(recipe.model_args)} if recipe.model_args else {}
    return {"recipe": recipe.name, **based_on, "dataset": dataset, "seed": recipe.seed,
            "val_fraction": recipe.val_fraction, **arch_args, "epochs": epoch, "accuracy": scores,
            "command": command, "vitkit": __version__, "ema": recipe.ema, "trained_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def run_summary(recipe, data, history: list[dict[str, Any]], *, out, model: str, command: str, steps: int,
                final_split: str, final: dict[str, Any], best: dict[str, Any], wall: float, world: int,
                strategy: str | None, budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json of a finished run: what ran, its final and best numbers, time and throughput."""
    from .tasks.base import loggable

    seen = sum(h["img_per_s"] * h["train_time_s"] for h in history)
    train_time = sum(h["train_time_s"] for h in history)
    return {
        "status": "done", "out": str(out), "recipe": recipe.name,
        **({"based_on": recipe.based_on} if recipe.based_on else {}), "model": model, "data": data.name,
        "command": command, "epochs": history[-1]["epoch"], "steps": steps,
        "final": {"split": final_split} | loggable(final), "best": dict(best), "wall_time_s": wall,
        "train_time_s": train_time, "img_per_s": seen / max(train_time, 1e-9), "world_size": world,
        "strategy": strategy, "ema": recipe.ema, "precision": "bf16" if recipe.bf16 else "fp32",
        "threads": torch.get_num_threads(),
        **({"expected": recipe.expected} if recipe.expected else {}),  # a preset's own target, only on its own run
        "skipped_images": data.info.get("num_skipped", 0),
        **({"time_budget": budget | {"within": wall <= budget["budget_s"]}} if budget else {}),
    }


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.created = False  # this run made the folder (so `discard` may remove it)

    def finished(self) -> bool:
        """A completed run is here (summary.json with status done)."""
        return self.summary().get("status") == "done"

    def summary(self) -> dict[str, Any]:
        """summary.json (empty when there is none or it does not parse)."""
        try:
            summary = json.loads((self.path / "summary.json").read_text())
        except (OSError, ValueError):
            return {}
        return summary if isinstance(summary, dict) else {}

    def diverged(self, loss: float, at, lr: float, write: bool) -> TrainingError:
        """The error for a non-finite loss at the step after `at` (a Progress); `write`: summary.json says so."""
        last = self.path / "last.safetensors"
        keep = (f"the last good checkpoint is {last} (epoch {at.epoch})" if last.exists() and at.epoch
                else "no checkpoint had been saved yet")
        if write:
            self.write_summary({"status": "diverged", "step": at.step + 1, "epoch": at.epoch + 1, "loss": str(loss)})
        return TrainingError(f"loss became {loss} at step {at.step + 1} (epoch {at.epoch + 1}, batch "
                             f"{at.batch_in_epoch + 1}); stopped without saving; {keep}. Lower the lr (now {lr:g}) "
                             "or keep clip_grad on")

    def remove_stale_temps(self) -> tuple[int, int]:
        """Before a run writes here: the temp files a killed write left (atomic_path's pattern only; other
        files stay) -> (files removed, bytes freed)."""
        return remove_stale_temps_in(self.path)

    def start(self, config: dict[str, Any]) -> None:
        """A fresh run: a previous run's files go (other files in the folder stay), then config.json and empty
        logs."""
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        atomic_write_text(self.path / "config.json", json.dumps(config, indent=2, default=str))
        atomic_write_text(self.path / "metrics.jsonl", "")
        atomic_write_text(self.path / "steps.jsonl", "")

    def discard(self) -> None:
        """Undo `start` after a failure before the first optimiser step: the folder goes if this run made it;
        a folder that was there before keeps everything but this run's files."""
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)

    def reconcile(self, history: list[dict[str, Any]], step: int) -> None:
        """A killed run may have flushed step lines past its saved state, or saved a state before writing
        its metrics line: rewrite both logs from the state so each epoch and step appears exactly once."""
        self.write_metrics(history)
        steps, seen = [], set()
        path = self.path / "steps.jsonl"
        for line in (path.read_text().splitlines() if path.exists() else []):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill (older versions appended in place)
                continue
            if rec["step"] <= step and rec["step"] not in seen:
                seen.add(rec["step"])
                steps.append(line + "\n")
        atomic_write_text(path, "".join(steps))

    def append_steps(self, records: list[dict[str, Any]]) -> None:
        """Per-step loss and LR -> steps.jsonl (the DDP and resume tests compare these)."""
        if records:
            path = self.path / "steps.jsonl"
            old = path.read_text() if path.exists() else ""
            atomic_write_text(path, old + _jsonl(records))

    def write_metrics(self, history: list[dict[str, Any]]) -> None:
        atomic_write_text(self.path / "metrics.jsonl", _jsonl(history))

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2))

    def save_checkpoint(self, model, name: str, class_names, provenance: dict[str, Any]) -> None:
        path = self.path / name
        try:
            model_io.save(model, path, class_names=class_names, provenance=provenance)
        except _WRITE_ERRORS as e:
            raise TrainingError(f"could not write {path}: {_reason(e)}; the previous file is intact "
                                "(writes are atomic)") from None

    def save_task_checkpoints(self, task, class_names, provenance: dict[str, Any]) -> list[Path]:
        """The task's own checkpoints (`Task.checkpoints`: DINO's teacher), beside last.safetensors; `provenance`
        is the run's (last.safetensors'), which the task adapts."""
        paths = []
        for name, (model, prov) in task.checkpoints(dict(provenance)).items():
            self.save_checkpoint(model, name, class_names, prov)
            paths.append(self.path / name)
        return paths

    def save_state(self, *, model_sd, optimizer, ema_sd, task_sd, info: dict[str, Any]) -> None:
        path = self.path / "state.safetensors"
        try:
            save_state(path, model_sd=model_sd, optimizer=optimizer, ema_sd=ema_sd, task_sd=task_sd, info=info)
        except _WRITE_ERRORS as e:
            raise TrainingError(f"could not write {path}: {_reason(e)}; the previous state is intact "
                                "(writes are atomic)") from None

    def save_run(self, strategy, optimizer, ema, task, info: dict[str, Any], gathered=None) -> None:
        """The resumable state through the run's strategy: every rank calls this (a sharded state is gathered
        unless `gathered` holds it); the main process writes."""
        gathered = gathered or strategy.gather(optimizer)
        if strategy.d.main:
            model_sd, optimizer = strategy.saved(optimizer, gathered)
            self.save_state(model_sd=model_sd, optimizer=optimizer, info=info, task_sd=task.resume_state(),
                            ema_sd=ema.state_dict() if ema is not None else None)

    def load_run(self, strategy, optimizer, ema, task):
        """state.safetensors into the model (through the strategy), optimiser, EMA, task and RNG -> the
        Progress it saved (the run folder's logs cut back to it)."""
        from .state import Progress

        st = self.load_state()
        strategy.load(optimizer, st["model"], st["optimizer"])
        if ema is not None and st["ema"] is not None:
            ema.load_state_dict(st["ema"])
        task.load_resume_state(st["task"])
        if st["rng"] is not None:
            torch.set_rng_state(st["rng"])
        at = Progress.from_info(st["info"])
        if strategy.d.main:
            self.reconcile(at.history, at.step)
        return at

    def load_state(self) -> dict[str, Any]:
        path = self.path / "state.safetensors"
        if not path.exists():
            raise TrainingError(f"{self.path}: nothing to resume (no state.safetensors)")
        return load_state(path)

    def report(self, summary: dict[str, Any], history: list[dict[str, Any]], final: dict[str, Any],
               class_names: list[str], title: str, figures: dict[str, Path] | None = None) -> Path:
        """summary.json, the curves, the confusion matrix (when the task has one), the task's own figures
        (title -> PNG in the run folder) and report.md."""
        from .report import plot_confusion, plot_curves, write_report

        plot_curves(history, self.path / "curves.png")
        if isinstance(final.get("confusion"), torch.Tensor):
            plot_confusion(final["confusion"], class_names, self.path / "confusion.png", title)
        self.write_summary(summary)
        return write_report(self.path, summary, figures)
