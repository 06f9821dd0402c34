"""Training by time budget (`vitkit train --time-budget 15m`, recipe field `time_budget_s`): how many epochs fit.

A fixed-epoch recipe tuned on one machine overruns on a slower one (the fashion-mnist-conv preset measured 1.6x
over its 15 minutes on a second Zen 4 with the same flags). So a budget run measures where it runs: after a
few warm-up steps it times optimiser steps, estimates an evaluation from them (a forward pass costs about a
third of a training step per image), and plans the most optimiser steps for which

    elapsed + steps left x step time + evaluations left x evaluation time + final evaluations <= budget x (1 - margin)

(an evaluation at every epoch's end, the last epoch's included, which may be cut short: a budget smaller than
one epoch still ends in time).
The LR schedule (warm-up and cosine decay), DINO's momentum schedule and MixUp's last epochs are then laid
over the planned steps. Until the first evaluation the recent steps' median is checked every `CHECK_EVERY`
steps, and after each epoch's evaluation, with its time measured, the epoch's mean step time and the evaluation
are: the plan is made again where either drifted by more than `DRIFT` from the plan's. A budget that cannot hold
the evaluations says so with the time to expect (`expected_s`). The plan is saved in the run's state, so
--resume keeps it, and summary.json records budget, plan and what ran.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

WARMUP_STEPS = 2  # not timed: allocation, thread start-up, lazy initialisation
TIMED_STEPS = 5  # timed before the first plan
DRIFT = 0.10  # re-plan when the times moved more than this
MARGIN = 0.03  # the plan aims this fraction below the budget (report writing, timing noise)
CHECK_EVERY = 25  # until the first evaluation, the step time is checked for drift every this many steps
FORWARD_SHARE = 1 / 3  # an image's forward pass against its training step (forward + backward)
MAX_EPOCHS = 100_000


def parse_duration(text: str) -> float:
    """'900', '900s', '15m', '1.5h' -> seconds (one clear line for anything else)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"a time budget is a positive number of seconds, minutes or hours (900, 900s, 15m, "
                          f"1.5h), got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@dataclass
class Plan:
    """What a budget run planned, and from which measurements."""

    budget_s: float
    steps: int = 0  # the planned optimiser steps (0: not planned yet)
    epochs: int = 0  # epochs they touch (the last may be partial)
    step_s: float = 0.0  # seconds per optimiser step, measured
    eval_s: float = 0.0  # seconds per evaluation of the eval split (estimated, then measured)
    final_s: float = 0.0  # the final evaluations (test split, and the best checkpoint on test)
    replanned: bool = False  # an epoch end was reached: the in-epoch step checks are over
    planned_at: int = 0  # the step of the first plan (the drift checks count from it)
    changes: int = 0  # how many checks changed the plan
    expected_s: float = 0.0  # the run's wall time the plan expects (over budget_s: not even one evaluation fits)
    times: list[float] = field(default_factory=list)  # the timed steps so far (kept for --resume)
    recent: list[float] = field(default_factory=list)  # the last steps' times, for the drift checks

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("times", "recent")}


class TimeBudget:
    """Plans epochs to fit `budget_s`; `steps_per_epoch`, images per micro-batch step, images per evaluation
    (`n_eval`) and in the final evaluations (`n_final`) size the estimate."""

    def __init__(self, budget_s: float, steps_per_epoch: int, images_per_step: int, n_eval: int, n_final: int,
                 plan: Plan | None = None):
        """`plan`: the one a resumed run saved (kept as it is)."""
        self.steps_per_epoch, self.images_per_step = steps_per_epoch, images_per_step
        self.n_eval, self.n_final = n_eval, n_final
        self.plan = plan or Plan(budget_s)

    def on_step(self, seconds: float, step: int, elapsed: float) -> int | None:
        """After optimiser step `step` (1-based) that took `seconds`, `elapsed` seconds into the run: the planned
        steps when this step makes the first plan, else None."""
        p = self.plan
        if p.steps:
            return self._check_drift(seconds, step, elapsed)
        if step <= WARMUP_STEPS:
            return None
        p.times.append(seconds)
        if len(p.times) < TIMED_STEPS:
            return None
        p.step_s = statistics.median(p.times)
        per_image_eval = p.step_s / self.images_per_step * FORWARD_SHARE
        p.eval_s, p.final_s = per_image_eval * self.n_eval, per_image_eval * self.n_final
        p.planned_at = step
        return self._fit(step, elapsed)

    def _check_drift(self, seconds: float, step: int, elapsed: float) -> int | None:
        """Until the first evaluation, every CHECK_EVERY steps: the plan, made again when the recent steps' median
        moved more than DRIFT from the planned step time (a run whose steps slow down after the first few would
        otherwise run over: a 480 s budget took 664 s). The evaluations, not measured yet, follow the step time.
        Every process checks at the same steps, so the main process's plan can be broadcast."""
        p = self.plan
        if p.replanned:
            return None
        p.recent = (p.recent + [seconds])[-2 * TIMED_STEPS:]
        if (step - p.planned_at) % CHECK_EVERY or len(p.recent) < TIMED_STEPS:
            return None
        recent_s = statistics.median(p.recent)
        if abs(recent_s - p.step_s) <= DRIFT * p.step_s:
            return p.steps
        scale = recent_s / p.step_s
        p.step_s, p.eval_s, p.final_s = recent_s, p.eval_s * scale, p.final_s * scale
        p.changes += 1
        return self._fit(step, elapsed)

    def on_epoch_end(self, epoch: int, eval_seconds: float, step: int, elapsed: float, recent_step_s: float) -> int | None:
        """After epoch `epoch` (1-based) and its evaluation, once planned: the planned steps, made again where the
        epoch's step time or the evaluation moved more than DRIFT from the plan's. At every epoch end, not only
        the first: a shared machine's speed moves for minutes (a 900 s run whose steps went 0.21 -> 0.17 s after
        its first epoch ended at 797 s; one that slows down would run over). Every process gets a number at
        every epoch end, so the main process's can be broadcast. The schedules follow the new length from here
        on (a cosine re-laid late moves the LR by little: it is near its end either way)."""
        p = self.plan
        if not p.steps:
            return None
        p.replanned = True  # the step-time checks inside the first epoch end here: epoch ends re-plan from now
        if step >= p.steps:  # the planned steps are done: the LR has decayed, a longer plan would only raise it
            return p.steps
        drifted = [abs(new - old) > DRIFT * old for new, old in ((eval_seconds, p.eval_s), (recent_step_s, p.step_s))
                   if old > 0]
        if not any(drifted):
            return p.steps
        p.final_s *= eval_seconds / p.eval_s if p.eval_s > 0 else 1.0
        p.step_s, p.eval_s = recent_step_s, eval_seconds
        p.changes += 1
        return self._fit(step, elapsed)

    def _fit(self, step: int, elapsed: float) -> int:
        """The most optimiser steps (at least those done) whose training, evaluations at each epoch's end (the
        last, maybe partial, epoch's included) and final evaluations end by budget x (1 - MARGIN)."""
        p, spe = self.plan, self.steps_per_epoch
        left = p.budget_s * (1 - MARGIN) - elapsed - p.final_s
        pos = step % spe  # steps into the current epoch
        more = 0
        for ends in range(1, MAX_EPOCHS + 1):  # epoch ends (evaluations) still to come
            fits = math.floor((left - ends * p.eval_s) / p.step_s) if p.step_s > 0 else 0
            if fits <= (ends - 1) * spe - pos:  # not even one step into that epoch: more ends cannot fit either
                break
            more = max(more, min(ends * spe - pos, fits))
        p.steps = step + max(more, 0)
        p.epochs = max(1, math.ceil(p.steps / spe))
        ends = p.epochs - step // spe  # epoch-end evaluations still to come
        p.expected_s = elapsed + (p.steps - step) * p.step_s + ends * p.eval_s + p.final_s
        return p.steps


class RunLength:
    """How long a run is: the recipe's epochs, or a time budget's plan (all epochs may be, until planned).
    Setting it lays the task's schedules over it (`Task.on_train_start`, `Task.epochs`)."""

    def __init__(self, recipe, steps_per_epoch: int, task, *, world: int, n_eval: int, n_final: int,
                 plan: Plan | None):
        self.steps_per_epoch, self.task = steps_per_epoch, task
        self.budget = (TimeBudget(recipe.time_budget_s, steps_per_epoch, max(1, recipe.batch_size // world), n_eval,
                                  n_final, plan) if recipe.time_budget_s else None)
        self.set((self.budget.plan.steps or MAX_EPOCHS * steps_per_epoch) if self.budget
                 else recipe.epochs * steps_per_epoch)

    @property
    def plan(self) -> Plan | None:
        return self.budget.plan if self.budget else None

    def set(self, steps: int) -> None:
        """The run is `steps` optimiser steps (its last epoch cut short where they end inside it)."""
        self.total_steps, self.epochs = steps, max(1, math.ceil(steps / self.steps_per_epoch))
        self.task.on_train_start(self.total_steps, self.steps_per_epoch)
        self.task.epochs = self.epochs

    def describe(self) -> str:
        """The run's length for the start line."""
        if self.budget and not self.plan.steps:
            return f"a {self.plan.budget_s:.0f} s time budget (planned after a few steps)"
        return f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"

    def after_step(self, seconds: float, step: int, elapsed: float) -> int | None:
        return self.budget.on_step(seconds, step, elapsed) if self.budget else None

    def after_epoch(self, epoch: int, eval_seconds: float, step: int, elapsed: float, step_s: float) -> int | None:
        return self.budget.on_epoch_end(epoch, eval_seconds, step, elapsed, step_s) if self.budget else None
