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
    assert {row["task"] for row in rows.values()} <= set(TASKS)


def test_list_recipes_is_readable_in_80_columns_and_says_each_in_full_by_name(capsys, monkeypatch):
    """The table: two lines a preset (name and the gist of its target within the width; task and command),
    not the full measurements folded into a narrow column; `--list-recipes NAME` and -v give the full text."""
    monkeypatch.setenv("COLUMNS", "80")
    assert cli(["train", "--list-recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    body = lines[2:]  # under a two-line heading
    assert len(body) == 2 * len(PRESETS), lines
    for (first, second), (name, r) in zip(zip(body[::2], body[1::2]), PRESETS.items()):
        assert first.split()[0] == name and len(first) <= 80, first
        assert second.split()[0] == r.task and second.endswith(r.command), second
        gist = first[len(name):].strip().rstrip("…")
        assert gist and r.expected.startswith(gist.split()[0]), (first, r.expected)

    def said_in_full(out: str, r) -> bool:
        return " ".join(r.expected.split()) in " ".join(out.split())

    assert cli(["train", "--list-recipes", "fashion-mnist-deit"]) == 0
    out = capsys.readouterr().out
    assert said_in_full(out, PRESETS["fashion-mnist-deit"]) and PRESETS["fashion-mnist-deit"].command in out
    assert all(len(line) <= 80 for line in out.splitlines() if "vitkit train" not in line)  # wrapped to the width
    assert cli(["-v", "train", "--list-recipes"]) == 0
    out = capsys.readouterr().out
    assert all(said_in_full(out, r) for r in PRESETS.values())
    assert cli(["train", "--list-recipes", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown recipe 'nope'" in err[0]


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
        task = TASKS[r.task](r, model, num_classes=10, device=torch.device("cpu"))
        assert task.heads() and sum(p.numel() for m in task.heads() for p in m.parameters()) > 0
    # the fine-tuning preset adapts any checkpoint: run with --finetune it keeps its name (derive)
    ft = get_recipe("fashion-mnist-finetune")
    assert not is_bound(ft) and derive(ft, "runs/fashion-mnist-mae/last.safetensors").name == ft.name
    assert ft.layer_decay and ft.layer_decay < 1


def test_digits_preset_selects_on_a_validation_split_and_reports_test(tmp_path, capsys):
    """best.safetensors is chosen on images carved out of train; the test split only gives the final numbers."""
    assert 0 < get_recipe("digits").val_fraction < 1
    # the fraction belongs to the digits: other data gets the trainer's default for it, another model keeps it
    assert derive(get_recipe("digits").replace(data="flowers")).val_fraction == 0.0
    assert derive(get_recipe("digits").replace(data="flowers", val_fraction=0.3)).val_fraction == 0.3
    assert derive(get_recipe("digits").replace(model="vit_tiny_patch4_28")).val_fraction == 0.1
    out = tmp_path / "run"
    assert cli(["train", "--recipe", "digits", "--out", str(out), "--epochs", "2", "--set", "steps_per_epoch=3",
                "--set", "eval_batch_size=512", "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["recipe"] == "digits" and summary["best"]["split"] == "val", summary["best"]
    assert summary["final"]["split"] == "test" and "test_top1" in summary["best"]  # the best-on-val model, on test
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["data"]["val"] == len(cfg["data"]["split_indices"]["val_from_train"]) > 0
    assert cfg["data"]["test"] == 359 and cfg["data"]["train"] + cfg["data"]["val"] == 1797 - 359


def test_the_fashion_mnist_presets_are_budget_recipes_and_epochs_given_make_a_fixed_run():
    budgets = {name: PRESETS[name].time_budget_s for name in ("fashion-mnist", "fashion-mnist-conv",
               "fashion-mnist-resnet18", "fashion-mnist-mae", "fashion-mnist-conv-mae", "fashion-mnist-dino",
               "fashion-mnist-finetune")}
    assert budgets == {"fashion-mnist": 900, "fashion-mnist-conv": 900, "fashion-mnist-resnet18": 900,
                       "fashion-mnist-mae": 300, "fashion-mnist-conv-mae": 300, "fashion-mnist-dino": 600,
                       "fashion-mnist-finetune": 420}
    for name, budget in budgets.items():  # the text states the budget it runs on
        assert f"time_budget_s={budget:g}" in PRESETS[name].expected, name
    # epochs given without a budget (Python, --set, a teacher's task.teacher_set) is a fixed run
    assert PRESETS["fashion-mnist"].replace(epochs=2).time_budget_s == 0
    assert PRESETS["fashion-mnist"].override(["epochs=2"]).time_budget_s == 0
    assert PRESETS["fashion-mnist"].override(["epochs=2", "time_budget_s=60"]).time_budget_s == 60
    assert PRESETS["fashion-mnist"].replace(lr=1e-3).time_budget_s == 900  # anything else keeps the budget
    assert PRESETS["digits"].time_budget_s == 0  # the demo's recipe stays a fixed 40 epochs
