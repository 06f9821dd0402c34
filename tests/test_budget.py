"""Training by time budget (training/budget.py): the plan's arithmetic, the command line, and a real run that
plans its epochs from its own step times, lays the LR schedule over them, and keeps the plan on --resume.
No assertion here depends on how fast this machine is: the measured times are read back from the run."""
from __future__ import annotations

import json
import math

import pytest

from vitkit.cli.main import main as cli
from vitkit.errors import ConfigError
from vitkit.training.budget import CHECK_EVERY, DRIFT, MARGIN, TIMED_STEPS, WARMUP_STEPS, TimeBudget, parse_duration
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


def _cost(steps_after: int, pos: int, spe: int, step_s: float, eval_s: float) -> float:
    """Seconds for `steps_after` more steps from `pos` steps into an epoch, with an evaluation at each epoch end
    (the last, partial one's included)."""
    return steps_after * step_s + math.ceil((pos + steps_after) / spe) * eval_s


def test_the_plan_takes_the_most_steps_that_fit_with_their_evaluations():
    # 10 steps an epoch of 0.5 s, 64 images a step: an evaluation of 320 images ~ 320 x 0.5 / 64 / 3 s
    b = TimeBudget(100.0, steps_per_epoch=10, images_per_step=64, n_eval=320, n_final=640)
    steps = _timed(b, 0.5, elapsed_at_plan=6.0)
    p = b.plan
    assert p.step_s == 0.5 and p.eval_s == pytest.approx(320 * 0.5 / 64 / 3) and p.final_s == pytest.approx(2 * p.eval_s)
    left = 100 * (1 - MARGIN) - 6.0 - p.final_s  # the warm-up steps (9 s each) are not in the estimate
    done = WARMUP_STEPS + TIMED_STEPS
    fits = [n for n in range(0, 1000) if _cost(n, done % 10, 10, p.step_s, p.eval_s) <= left]
    assert steps == done + max(fits) and p.epochs == math.ceil(steps / 10)


def test_a_budget_smaller_than_an_epoch_cuts_the_epoch():
    b = TimeBudget(20.0, steps_per_epoch=100, images_per_step=32, n_eval=100, n_final=100)
    steps = _timed(b, 0.5, elapsed_at_plan=4.0)
    assert WARMUP_STEPS + TIMED_STEPS <= steps < 100 and b.plan.epochs == 1
    assert _cost(steps - 7, 7, 100, 0.5, b.plan.eval_s) <= 20 * (1 - MARGIN) - 4.0 - b.plan.final_s
    late = TimeBudget(5.0, 100, 32, 100, 100)
    assert _timed(late, 0.5, elapsed_at_plan=10.0) == WARMUP_STEPS + TIMED_STEPS  # over already: stop now


def test_every_epoch_end_replans_where_the_times_drifted():
    b = TimeBudget(100.0, steps_per_epoch=10, images_per_step=64, n_eval=320, n_final=320)
    first = _timed(b, 0.5, elapsed_at_plan=6.0)
    # within 10%: the same plan, said as the same number
    same = TimeBudget(100.0, 10, 64, 320, 320)
    kept = _timed(same, 0.5, 6.0)
    assert same.on_epoch_end(1, same.plan.eval_s * 1.05, 10, 9.0, 0.52) == kept and same.plan.changes == 0
    # a later epoch whose steps ran 2x slower (a shared machine got busy): fewer steps, at least those done
    slower = same.on_epoch_end(2, same.plan.eval_s, 20, 20.0, 1.0)
    assert 20 <= slower < kept and same.plan.step_s == 1.0 and same.plan.changes == 1
    assert same.plan.expected_s <= 100 * (1 - MARGIN) + 1e-6
    # and one that ran at the old speed again: longer, still within the budget
    faster = same.on_epoch_end(3, same.plan.eval_s, 30, 30.0, 0.5)
    assert faster > slower and same.plan.changes == 2 and same.plan.expected_s <= 100 * (1 - MARGIN) + 1e-6
    # the end of the last planned step: no more planning, however the times moved (the LR has decayed)
    assert same.on_epoch_end(9, same.plan.eval_s, faster, 90.0, 0.1) == faster and same.plan.changes == 2
    # the evaluation took 4x the estimate and steps 2x: fewer steps, at least those done
    again = b.on_epoch_end(1, b.plan.eval_s * 4, 10, 12.0, 1.0)
    assert b.plan.replanned and 10 <= again < first and b.plan.step_s == 1.0


def test_steps_that_slow_down_inside_the_first_epoch_shrink_the_plan_before_it_ends():
    """A long first epoch (no evaluation to re-plan at for minutes): the step time is checked every CHECK_EVERY
    steps; steady steps keep the plan (said as the same number), steps 1.5x slower shrink it to what fits."""
    b = TimeBudget(480.0, steps_per_epoch=468, images_per_step=128, n_eval=10_000, n_final=10_000)
    first = _timed(b, 1.0, elapsed_at_plan=10.0)
    planned_at, elapsed = b.plan.planned_at, 10.0
    answers = {}
    for step in range(planned_at + 1, planned_at + 2 * CHECK_EVERY + 1):
        slow = step > planned_at + CHECK_EVERY
        elapsed += 1.5 if slow else 1.0 * (1 + DRIFT / 2)
        got = b.on_step(1.5 if slow else 1.0 * (1 + DRIFT / 2), step, elapsed)
        if got is not None:
            answers[step] = got
    assert list(answers) == [planned_at + CHECK_EVERY, planned_at + 2 * CHECK_EVERY]  # only at the checks
    assert answers[planned_at + CHECK_EVERY] == first  # within DRIFT: unchanged
    shrunk = answers[planned_at + 2 * CHECK_EVERY]
    assert shrunk < first and b.plan.step_s == 1.5 and b.plan.changes == 1
    assert b.plan.expected_s <= 480.0 * (1 - MARGIN) + 1e-6  # what is left fits, at the new step time
    b.on_epoch_end(1, b.plan.eval_s, shrunk, elapsed, 1.5)
    assert b.on_step(1.5, shrunk + CHECK_EVERY, elapsed) is None  # after the first evaluation: no more checks


def test_a_budget_that_cannot_hold_its_evaluations_says_how_long_the_run_will_take(tmp_path, capsys):
    b = TimeBudget(40.0, steps_per_epoch=468, images_per_step=128, n_eval=10_000, n_final=10_000)
    _timed(b, 1.0, elapsed_at_plan=10.0)  # an evaluation ~26 s and the final one ~26 s: over 40 s already
    assert b.plan.expected_s > 40.0
    run = tmp_path / "run"
    # 10 ms: less than the steps timed before the plan take on any machine (a 0.5 s budget held the whole run,
    # 10 steps and their evaluations, on a 2-core Xeon with AMX)
    assert cli(["train", "--out", str(run), *[a for a in ARGS if a != "--quiet"], "--time-budget", "0.01s"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("time budget")]
    assert said and "the budget is too small for the evaluations: expect ~" in said[0], err


ARGS = ["--data", "digits", "--model", "vit_pico_patch2_8", "--quiet", "--set", "steps_per_epoch=8",
        "--set", "batch_size=32", "--set", "threads=1", "--set", "bf16=false", "--set", "warmup_epochs=0",
        "--set", "eval_batch_size=512", "--set", "min_lr=1e-5"]


def _steps(run) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def test_a_budget_run_plans_its_epochs_and_resume_keeps_the_plan(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["train", "--out", str(run), *ARGS, "--time-budget", "6s", "--stop-after-epochs", "1"]) == 0
    saved = load_state(run / "state.safetensors")["info"]["plan"]
    assert saved["budget_s"] == 6.0 and saved["steps"] >= 7 and saved["step_s"] > 0
    assert json.loads((run / "config.json").read_text())["recipe"]["time_budget_s"] == 6.0
    assert cli(["train", "--out", str(run), "--resume", "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    plan = summary["time_budget"]
    # kept: the resumed process goes on from the saved plan (made at the same step, from the first process's
    # steps: not timed afresh), and its epoch ends may re-plan it from there, as an uninterrupted run's would
    assert {k: plan[k] for k in ("budget_s", "planned_at", "replanned")} == \
        {k: saved[k] for k in ("budget_s", "planned_at", "replanned")}
    assert plan["changes"] >= saved["changes"] and (plan["changes"] > saved["changes"] or plan["steps"] == saved["steps"])
    assert summary["steps"] == plan["steps"] and summary["epochs"] == plan["epochs"] == math.ceil(plan["steps"] / 8)
    # the cosine schedule was laid over the planned steps: it ends at min_lr (1e-5 of lr 3e-3 here). Where the
    # resumed run's epoch end re-planned (this machine's times moved), a plan cut to the step at hand ends the run
    # there, before the decay is through: the LR has still come down, but not to min_lr
    lrs = [s["lr"] for s in _steps(run)]
    assert len(lrs) == plan["steps"]
    if plan["steps"] > 8:
        assert lrs[-1] < lrs[0]
        if plan["changes"] == saved["changes"]:
            assert lrs[-1] == pytest.approx(1e-5, rel=0.5, abs=3e-3 / plan["steps"])
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


def test_a_budget_under_one_epoch_stops_inside_it_and_still_evaluates(tmp_path, capsys):
    run = tmp_path / "short"
    assert cli(["train", "--out", str(run), *ARGS, "--set", "steps_per_epoch=1000", "--time-budget", "1s"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    full_epoch = -(-1295 // 32)  # digits' train split in batches of 32
    assert summary["epochs"] == 1 and summary["steps"] < full_epoch and summary["steps"] == summary["time_budget"]["steps"]
    assert "top1" in summary["final"]  # the cut epoch was evaluated, then the final test
