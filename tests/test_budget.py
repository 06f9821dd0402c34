"""Training by time budget (training/budget.py): the plan's arithmetic, the command line, and a real run that
plans its epochs from its own step times, lays the LR schedule over them, and keeps the plan on --resume.
No assertion here depends on how fast this machine is: the measured times are read back from the run."""
from __future__ import annotations

import json

import pytest

from vitkit.cli.main import main as cli
from vitkit.errors import ConfigError
from vitkit.training.budget import MARGIN, TIMED_STEPS, WARMUP_STEPS, TimeBudget, parse_duration
from vitkit.training.state import load_state


@pytest.mark.parametrize("text, seconds", [("900", 900), ("900s", 900), ("15m", 900), ("1.5h", 5400), (" 2m ", 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15 minutes", "-5m", "0", "m", "1d"])
def test_bad_durations_are_one_line(text):
    with pytest.raises(ConfigError, match="a time budget is a positive number"):
        parse_duration(text)


def _timed(budget: TimeBudget, step_s: float, elapsed_at_plan: float) -> int | None:
    """Feed warm-up and timed steps of `step_s` seconds; the plan comes at the last timed step."""
    planned = None
    for step in range(1, WARMUP_STEPS + TIMED_STEPS + 1):
        planned = budget.on_step(9.0 if step <= WARMUP_STEPS else step_s, step, elapsed_at_plan)
        assert (planned is None) == (step < WARMUP_STEPS + TIMED_STEPS)
    return planned


def test_the_plan_fits_steps_and_evaluations_in_the_budget():
    # 10 steps an epoch of 0.5 s, 64 images a step: an evaluation of 320 images ~ 320 x 0.5 / 64 / 3 s
    b = TimeBudget(100.0, steps_per_epoch=10, images_per_step=64, n_eval=320, n_final=640)
    epochs = _timed(b, 0.5, elapsed_at_plan=6.0)
    p = b.plan
    assert p.step_s == 0.5 and p.eval_s == pytest.approx(320 * 0.5 / 64 / 3) and p.final_s == pytest.approx(2 * p.eval_s)
    # the warm-up steps (9 s each) are not in the estimate; what is left after 7 of epoch 1's 10 steps:
    left = 100 * (1 - MARGIN) - 6.0 - p.final_s - (3 * 0.5 + p.eval_s)
    per_epoch = 10 * 0.5 + p.eval_s
    assert epochs == 1 + int(left // per_epoch)
    total = 6.0 + 3 * 0.5 + epochs * p.eval_s + (epochs - 1) * 10 * 0.5 + p.final_s
    assert total <= 100 * (1 - MARGIN) < total + per_epoch  # fits, and one more epoch would not


def test_a_drift_after_the_first_evaluation_replans_once():
    b = TimeBudget(100.0, steps_per_epoch=10, images_per_step=64, n_eval=320, n_final=320)
    first = _timed(b, 0.5, elapsed_at_plan=6.0)
    # within 10%: the same plan, said once
    same = TimeBudget(100.0, 10, 64, 320, 320)
    _timed(same, 0.5, 6.0)
    assert same.on_epoch_end(1, same.plan.eval_s * 1.05, 10, 9.0, 0.52) == same.plan.epochs
    assert same.on_epoch_end(2, 50.0, 20, 20.0, 5.0) is None  # never again
    # the evaluation took 4x the estimate and steps 2x: fewer epochs, at least the one done
    again = b.on_epoch_end(1, b.plan.eval_s * 4, 10, 12.0, 1.0)
    assert b.plan.replanned and again < first and again >= 1 and b.plan.step_s == 1.0


def test_a_budget_that_cannot_hold_one_more_epoch_still_finishes_the_current_one():
    b = TimeBudget(5.0, steps_per_epoch=100, images_per_step=32, n_eval=100, n_final=100)
    assert _timed(b, 0.5, elapsed_at_plan=4.0) == 1


ARGS = ["--data", "digits", "--model", "vit_pico_patch2_8", "--quiet", "--set", "steps_per_epoch=8",
        "--set", "batch_size=32", "--set", "threads=1", "--set", "bf16=false", "--set", "warmup_epochs=0",
        "--set", "eval_batch_size=512", "--set", "min_lr=1e-5"]


def _steps(run) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def test_a_budget_run_plans_its_epochs_and_resume_keeps_the_plan(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["train", "--out", str(run), *ARGS, "--time-budget", "6s", "--stop-after-epochs", "1"]) == 0
    saved = load_state(run / "state.safetensors")["info"]["plan"]
    assert saved["budget_s"] == 6.0 and saved["epochs"] >= 1 and saved["step_s"] > 0 and saved["replanned"]
    assert json.loads((run / "config.json").read_text())["recipe"]["time_budget_s"] == 6.0
    assert cli(["train", "--out", str(run), "--resume", "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    plan = summary["time_budget"]
    assert {k: plan[k] for k in saved if k != "times"} == {k: saved[k] for k in saved if k != "times"}  # kept
    assert summary["epochs"] == plan["epochs"] and summary["steps"] == 8 * plan["epochs"]
    # the cosine schedule was laid over the planned steps: it ends at min_lr (1e-5 of lr 3e-3 here)
    lrs = [s["lr"] for s in _steps(run)]
    assert len(lrs) == 8 * plan["epochs"]
    if plan["epochs"] > 1:
        assert lrs[-1] < lrs[0] and lrs[-1] == pytest.approx(1e-5, rel=0.5, abs=3e-3 / (8 * plan["epochs"]))
    assert plan["within"] == (summary["wall_time_s"] <= 6.0)


def test_epochs_turn_a_budget_recipe_into_a_fixed_run_and_a_bad_budget_is_one_line(tmp_path, capsys, monkeypatch):
    from vitkit.training.recipes import PRESETS

    assert cli(["train", "--out", str(tmp_path / "bad"), *ARGS, "--time-budget", "15 minutes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "time budget" in err[0]
    assert not (tmp_path / "bad").exists()
    monkeypatch.setitem(PRESETS, "digits", PRESETS["digits"].replace(time_budget_s=600.0))  # a budget preset
    run = tmp_path / "fixed"
    assert cli(["train", "--recipe", "digits", "--out", str(run), *ARGS, "--epochs", "1"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert "time_budget" not in summary and summary["epochs"] == 1
