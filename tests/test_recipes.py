"""The presets: each states its command and its target or measured result, `--list-recipes` shows them, and
the small-data presets of issue 12 (DeiT, MAE, DINO, their fine-tuning) build their model and objective."""
from __future__ import annotations

import json

import torch

from vitkit.cli.main import main as cli
from vitkit.training import models as model_io
from vitkit.training.recipes import PRESETS, derive, get_recipe, is_bound
from vitkit.training.tasks import TASKS
from vitkit.training.tasks.distillation import DistillationOptions

SMALL_DATA = ["fashion-mnist-deit", "fashion-mnist-deit-soft", "fashion-mnist-mae", "fashion-mnist-dino",
              "fashion-mnist-finetune", "digits-dino"]


def test_every_preset_states_its_command_and_result():
    assert set(SMALL_DATA) | {"digits", "fashion-mnist", "fashion-mnist-resnet18", "finetune"} <= set(PRESETS)
    for name, r in PRESETS.items():
        assert r.name == name and r.command.startswith(f"vitkit train --recipe {name}"), name
        assert r.expected, name
        if is_bound(r):  # a number, or says honestly that there is none yet
            assert "measured" in r.expected, name
        r.validate()
        assert r.task in TASKS


def test_list_recipes_shows_each_result(capsys):
    assert cli(["train", "--list-recipes", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows.keys() == PRESETS.keys()
    for name, r in PRESETS.items():
        assert rows[name]["expected"] == r.expected and rows[name]["command"] == r.command
    assert "91.95%" in rows["fashion-mnist-resnet18"]["expected"]


def test_small_data_presets_select_on_validation_and_build_their_objective():
    for name in SMALL_DATA:
        r = get_recipe(name)
        if r.data == "fashion-mnist":
            assert r.val_fraction > 0, name  # model selection never looks at the test split
    # DeiT: a student with a distillation token; the teacher recipe is a preset, trained into its own folder
    for name, kind in (("fashion-mnist-deit", "hard"), ("fashion-mnist-deit-soft", "soft")):
        r = get_recipe(name)
        opts = DistillationOptions.from_dict(r.task_args)
        assert opts.kind == kind and opts.teacher == "recipe:fashion-mnist-resnet18"
        assert opts.teacher_out == PRESETS["fashion-mnist-resnet18"].command.split("--out ")[1]
        student = model_io.build(r, 10, 1, (28, 28))
        assert student.cfg.distilled and student.head_dist is not None
    # MAE and DINO: the objective builds on the recipe's model (decoder / head and teacher)
    for name in ("fashion-mnist-mae", "fashion-mnist-dino", "digits-dino"):
        r = get_recipe(name)
        torch.manual_seed(0)
        model = model_io.build(r, 10, 1, (28, 28) if r.data == "fashion-mnist" else (8, 8))
        task = TASKS[r.task](r, net=model, model=model, num_classes=10, device=torch.device("cpu"))
        assert task.modules() and sum(p.numel() for m in task.modules() for p in m.parameters()) > 0
    # the fine-tuning preset adapts any checkpoint: run with --finetune it keeps its name (derive)
    ft = get_recipe("fashion-mnist-finetune")
    assert not is_bound(ft) and derive(ft, "runs/fashion-mnist-mae/last.safetensors").name == ft.name
    assert ft.layer_decay and ft.layer_decay < 1
