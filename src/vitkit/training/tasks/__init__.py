"""Training objectives, one module each; a recipe's `task` field names one of `TASKS`.

A new objective is a module here with a `Task` subclass (see base.py for what it implements), added to
`TASKS` below; the loop in training/trainer.py does not change.
"""
from __future__ import annotations

from ...errors import ConfigError
from .base import Task, loggable, to_device
from .classification import ClassificationTask
from .detect import DetectTask
from .dino import DinoTask
from .distillation import DistillationTask
from .mae import MaeTask
from .segment import SegmentTask

TASKS: dict[str, type[Task]] = {"classification": ClassificationTask, "distillation": DistillationTask,
                                "mae": MaeTask, "dino": DinoTask, "segment": SegmentTask, "detect": DetectTask}


def task_class(recipe) -> type[Task]:
    if recipe.task not in TASKS:
        raise ConfigError(f"unknown task {recipe.task!r}; known: {', '.join(TASKS)}")
    return TASKS[recipe.task]


def make_task(recipe, model, **kw) -> Task:
    """The recipe's objective around `model` (num_classes=, device=)."""
    return task_class(recipe)(recipe, model, **kw)


__all__ = ["TASKS", "ClassificationTask", "DetectTask", "DinoTask", "DistillationTask", "MaeTask", "SegmentTask", "Task",
           "loggable", "make_task", "task_class", "to_device"]
