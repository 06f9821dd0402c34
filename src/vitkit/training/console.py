"""What a training run shows while it runs: counts in words, the progress bar and its time estimate.

The estimate comes from a moving window of recent step times after a few warm-up steps, never from the first
step alone: the first steps pay for memory allocation, thread start-up and lazy initialisation, and on a CPU
the first step of a 224 px ViT has been measured at 20x a later one (an ETA of 3 min 25 s for a run that took
9 s). It is said as approximate ("~3 min").
"""
from __future__ import annotations

import statistics
from collections import deque

WARMUP_STEPS = 2  # optimiser steps left out of the estimate
WINDOW_STEPS = 20  # the estimate follows the median of this many recent steps
MIN_SAMPLES = 3  # timed steps needed before there is an estimate at all


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 epoch', '2 epochs', '1 process', '4 processes' (`plural` where adding -s/-es is wrong)."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural or noun + ('es' if noun.endswith(('s', 'sh', 'x')) else 's')}"


def approx_duration(seconds: float) -> str:
    """A time said as approximate: '~7 s', '~40 s' (to 5 s), '~3 min', '~1 h 05 min'."""
    if seconds < 10:
        return f"~{max(1, round(seconds))} s"
    if seconds < 57.5:
        return f"~{5 * round(seconds / 5)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"~{minutes} min"
    return f"~{minutes // 60} h {minutes % 60:02d} min"


def _seconds(value: float) -> str:
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


class Eta:
    """Time left in a run's training steps (evaluation not included), from a moving window after warm-up."""

    def __init__(self, steps_left: int, warmup: int = WARMUP_STEPS, window: int = WINDOW_STEPS):
        self.steps_left, self.warmup = steps_left, warmup
        self.done = 0  # steps recorded by this process (a resumed run warms up again)
        self.recent: deque[float] = deque(maxlen=window)
        self.min_samples = min(MIN_SAMPLES, window)

    def record(self, seconds: float) -> None:
        """One optimiser step done, which took `seconds` (data loading included)."""
        self.done += 1
        self.steps_left = max(self.steps_left - 1, 0)
        if self.done > self.warmup:
            self.recent.append(seconds)

    def step_seconds(self) -> float | None:
        """A step's time now (the window's median: one slow step, such as an epoch's first, does not move it)."""
        return statistics.median(self.recent) if len(self.recent) >= self.min_samples else None

    def seconds_left(self) -> float | None:
        step = self.step_seconds()
        return None if step is None else step * self.steps_left

    def text(self) -> str:
        """For the progress bar: '~3 min left', or nothing while warming up or once done."""
        left = self.seconds_left()
        return f"{approx_duration(left)} left" if left else ""

    def describe(self) -> str:
        """The one line said when the first estimate is ready."""
        step, left = self.step_seconds(), self.seconds_left()
        return (f"ETA: steps take ~{_seconds(step)} s each after {count(self.warmup, 'warm-up step')}: "
                f"{approx_duration(left)} for the {count(self.steps_left, 'step')} left (evaluation not included)")


def progress_bar(console, disable: bool):
    """The training bar: steps done, loss, lr, images per second and the Eta's text (a task field `eta`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}  {task.fields[ips]:.0f} img/s"),
                    TextColumn("{task.fields[eta]}"), console=console, disable=disable, transient=False)


def print_cost(console, model, micro_batch: int, bf16: bool) -> None:
    """The closed-form cost (families that have one) before a heavy run: GMACs per image, parameters,
    activation memory for one micro-batch."""
    from ..models import get_family

    if get_family(model.family).cost is None:
        return
    from ..analysis.cost import format_bytes, model_cost

    c = model_cost(model, batch=micro_batch, dtype="bf16" if bf16 else "fp32")
    console.print(f"cost: {c.gmacs_per_image:.2f} GMACs per image forward (about 3x to train), "
                  f"{c.params_total / 1e6:.2f}M params, {format_bytes(c.activation_bytes)} of activations "
                  f"for a batch of {micro_batch} ({c.dtype}); an ETA follows after a few steps", soft_wrap=True)
