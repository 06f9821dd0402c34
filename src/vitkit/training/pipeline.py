"""The steps of `vitkit train` around the Trainer: the runs an objective needs first (a distillation teacher
given as recipe:NAME: `Task.runs_first`), each trained into its own folder or found finished there, then the
run itself. So no task ever starts a Trainer: the loop trains one module, and this file orders runs."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .distributed import teardown
from .recipes import Recipe, get_recipe
from .rundir import RunDir
from .tasks import task_class
from .trainer import Trainer


def run_first(name: str, folder: Path, overrides: tuple[str, ...], option: str, needed_by: str) -> Path:
    """best.safetensors of preset `name` trained in `folder` with `overrides`: a finished run there is reused,
    an unfinished one resumed, another recipe's run refused."""
    recipe = get_recipe(name).override(list(overrides))
    best = folder / "best.safetensors"
    if (folder / "config.json").exists():
        made_by = json.loads((folder / "config.json").read_text()).get("recipe", {})
        if (made_by.get("name"), made_by.get("model")) != (recipe.name, recipe.model):
            raise ConfigError(f"{folder} holds a run of recipe {made_by.get('name')!r} ({made_by.get('model')}), "
                              f"not the {option} recipe {name!r}; choose another --set task.{option}_out=FOLDER")
    if RunDir(folder).finished() and best.exists():
        return best
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"the {option} recipe:{name} is not trained yet: train it first (vitkit train --recipe "
                          f"{name} --out {folder}), then run this one under torchrun")
    resume = (folder / "state.safetensors").exists()
    command = " ".join(["vitkit train --recipe", name, "--out", str(folder), *(f"--set {a}" for a in overrides)])
    print(f"{needed_by}: {'resuming' if resume else 'training'} the {option} first: {command}",
          file=sys.stderr, flush=True)
    rng = torch.get_rng_state()  # the run that needs it draws as it would with the file ready
    try:
        Trainer(recipe, folder, resume=resume, command=command, quiet=True).run()
    finally:
        torch.set_rng_state(rng)
    return best


def prepare(recipe: Recipe) -> Recipe:
    """`recipe` with each option its objective needs a run for (`Task.runs_first`) set to that run's checkpoint."""
    needs = task_class(recipe).runs_first(recipe)
    if not needs:
        return recipe
    args = dict(recipe.task_args)
    for option, (name, folder, overrides) in needs.items():
        args[option] = str(run_first(name, Path(folder), overrides, option, recipe.task))
    return recipe.replace(task_args=args)


def train(recipe: Recipe, out: str | os.PathLike, **kw: Any) -> dict[str, Any]:
    """`vitkit train`: the runs the objective needs first, then this one (Trainer keywords in `kw`)."""
    try:
        return Trainer(prepare(recipe), out, **kw).run()
    finally:
        teardown()
