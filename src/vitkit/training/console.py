"""What a training run shows while it runs (the Reporter): counts in words, the progress bar and its time
estimate.

The estimate comes from a moving window of recent step times after a few warm-up steps, never from the first
step alone: the first steps pay for memory allocation, thread start-up and lazy initialisation, and on a CPU
the first step of a 224 px ViT has been measured at 20x a later one (an ETA of 3 min 25 s for a run that took
9 s). It is said as approximate ("~3 min").
"""
from __future__ import annotations

import statistics
from collections import deque

HEAVY_SIDE = 224  # on a CPU, a model that reads images this large (per side) gets a cost estimate and an ETA
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


class Reporter:
    """What a run says on stderr: the main process speaks, the others are `silent`; `quiet` keeps only the
    lines that end a run (done, stopped, already finished, interrupted). The command line passes one in; a
    notebook can pass a subclass that logs elsewhere."""

    def __init__(self, quiet: bool = False, silent: bool = False):
        self.quiet, self.silent = quiet, silent

    def console(self, always: bool = False):
        from rich.console import Console

        return Console(stderr=True, quiet=(self.quiet and not always) or self.silent)

    def say(self, text: str, always: bool = False) -> None:
        self.console(always).print(text, soft_wrap=True)

    def planned(self, plan) -> None:
        self.say(f"time budget {plan.budget_s:.0f} s: {count(plan.steps, 'step')} in {count(plan.epochs, 'epoch')} "
                 f"fit (steps {plan.step_s:.3g} s, "
                 f"an evaluation ~{plan.eval_s:.2g} s, the final ones ~{plan.final_s:.2g} s)"
                 + (" (re-planned: the times moved)" if plan.changes else "")
                 + (f"; the budget is too small for the evaluations: expect ~{approx_duration(plan.expected_s)}"
                    if plan.expected_s > plan.budget_s else ""))

    def start(self, name: str, model: str, params: int, data, n_eval: int, eval_split: str, size, length: str,
              steps: int, world: int, device) -> None:
        vs = data.info.get("val_split") or {}
        held = f", {vs['fraction']:.0%} of train held out" if vs.get("auto") else ""
        self.say(f"[bold]vitkit train[/] recipe {name}: {model} ({params / 1e6:.2f}M params) on {data.name} "
                 f"({len(data.train)} train / {n_eval} {eval_split}{held}) at {size[0]}x{size[1]} px, "
                 f"{length} x {count(steps, 'step')}, {count(world, 'process')}, {device}")
        if data.info.get("num_skipped"):
            self.say(f"[yellow]skipped {count(data.info['num_skipped'], 'unreadable image')}[/] (listed in config.json)")

    def already_finished(self, folder, summary: dict, epochs: int) -> dict:
        self.say(f"run {folder} already finished ({summary.get('epochs', epochs)}/{count(epochs, 'epoch')}); "
                 "nothing to do", always=True)
        return summary

    def stale_temps(self, removed: int, freed: int, folder) -> None:
        if removed:
            from ..analysis.cost import format_bytes

            self.say(f"removed {count(removed, 'stale temp file')} ({format_bytes(freed)}) left by interrupted "
                     f"writes in {folder}")

    def resumed(self, folder, at, epochs: int, total_steps: int) -> None:
        where = (f"at epoch {at.epoch + 1}/{epochs}, step {at.step}/{total_steps}" if at.epoch < epochs else
                 f"after its last epoch ({at.epoch}/{count(epochs, 'epoch')}) for the final evaluation and report")
        self.say(f"resuming {folder} {where}")

    def epoch(self, rec: dict, epochs: int, split: str, described: str) -> None:
        self.say(f"epoch {rec['epoch']}/{epochs} loss {rec['train_loss']:.4f} {split} {described} "
                 f"{rec['img_per_s']:.0f} img/s")

    def stopped(self, folder, epoch: int) -> None:
        self.say(f"stopped after epoch {epoch} as asked; continue with `vitkit train --out {folder} --resume`",
                 always=True)

    def interrupted(self, folder, at) -> None:
        self.say(f"vitkit train: interrupted at epoch {at.epoch + 1}, step {at.step}: saved a resumable state to "
                 f"{folder / 'state.safetensors'}; continue with `vitkit train --out {folder} --resume`", always=True)

    def done(self, described: str, epochs: int, seconds: float, report) -> None:
        """Also with `quiet`: the one line that says where the result is."""
        self.say(f"[bold green]done[/]: final {described} after {count(epochs, 'epoch')} in {seconds:.0f} s; "
                 f"report: {report}", always=True)

    def precision(self, bf16: bool, threads: int, note: str | None) -> None:
        self.say(f"precision {'bf16 autocast' if bf16 else 'fp32'}, {count(threads, 'torch thread')} per process")
        if note:
            self.say(note)

    def heavy(self, model, device, micro_batch: int, bf16: bool) -> bool:
        """A run on a CPU at HEAVY_SIDE px and up gets its cost said now, and an ETA once the steps are timed."""
        heavy = device.type == "cpu" and min(model.preprocess.input_size[1:]) >= HEAVY_SIDE
        if heavy and not self.silent:
            print_cost(self.console(), model, micro_batch, bf16)
        return heavy

    def progress(self, total: int, done: int, epoch: int, epochs: int, announce_eta: bool) -> StepBar:
        """The bar over the run's optimiser steps (none where nothing is left to train); `announce_eta`: the
        estimate is also said in a line, once, after the warm-up (a heavy run)."""
        return StepBar(self, total, done, epoch, epochs, announce_eta and not self.silent,
                       disable=self.quiet or self.silent or epoch >= epochs)


class StepBar:
    """A context manager: `step(loss, lr, ips, epoch, seconds)` after each optimiser step."""

    def __init__(self, reporter: Reporter, total: int, done: int, epoch: int, epochs: int, announce_eta: bool,
                 disable: bool):
        self.epochs, self.eta, self.announce = epochs, Eta(total - done), announce_eta
        self.epoch = epoch  # 0-based, the one the last step was in
        self.progress = progress_bar(reporter.console(), disable=disable)
        self.bar = self.progress.add_task(f"epoch {epoch + 1}/{epochs}", total=total, completed=done,
                                          loss=float("nan"), lr=0.0, ips=0.0, eta="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def step(self, loss: float, lr: float, ips: float, epoch: int, seconds: float) -> None:
        eta = self.eta
        self.epoch = epoch
        eta.record(seconds)
        self.progress.update(self.bar, advance=1, loss=loss, lr=lr, ips=ips,
                             description=f"epoch {epoch + 1}/{self.epochs}", eta=eta.text())
        if self.announce and eta.seconds_left() is not None:  # said once, after the warm-up
            self.announce = False
            if eta.steps_left:
                self.progress.console.print(eta.describe(), soft_wrap=True)

    def stop(self) -> None:
        self.progress.stop()

    def replan(self, total: int, done: int, epochs: int) -> None:
        """A time budget's plan: the run is now `epochs` epochs, `total` steps."""
        self.epochs = epochs
        self.eta.steps_left = max(total - done, 0)
        # shown at once: a plan made at the epoch's last step gets no later step to redraw the bar
        self.progress.update(self.bar, total=total, description=f"epoch {self.epoch + 1}/{epochs}",
                             eta=self.eta.text())
