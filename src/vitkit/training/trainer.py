"""The training loop: one process or DDP (torchrun), resumable at any step, deterministic given the seed.

The loop only orders the work. What is learnt is the task's (tasks.py: `out = task(batch)`, then
`out["loss"].backward()`); the data order and its determinism contract are in order.py; optimiser groups, the
LR schedule and EMA in optim.py; the run folder (config, logs, state, checkpoints, summary, report) in
rundir.py; process groups in distributed.py.
"""
from __future__ import annotations

import math
import os
import shlex
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..data.datasets import DataBundle, Transformed, default_val_fraction, load_data
from ..data.transforms import eval_transform, train_transform
from ..errors import ConfigError
from ..hardware import apply_fast_paths, choose_precision, this_machine
from ..runtime import torch_threads
from . import models as model_io
from .console import Eta, count, print_cost, progress_bar
from .distributed import Interrupt, all_mean, all_mean_grads, barrier, setup_distributed, teardown
from .optim import lr_factor, make_ema, param_groups
from .order import epoch_batches, step_seed
from .recipes import Recipe, check_preset_lr, derive
from .rundir import RunDir, TrainingError, provenance, run_config
from .tasks import loggable, make_task, to_device

__all__ = ["Interrupted", "Trainer", "TrainingError", "train"]

# on a CPU, a model that reads images this large (per side) gets a cost estimate and an ETA before it trains
HEAVY_SIDE = 224


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, handled: the state is saved and the main process has printed how to resume (`reported`, so
    the command line adds no second message)."""

    reported = True


class Trainer:
    def __init__(self, recipe: Recipe, out: str | os.PathLike, *, resume: bool = False, finetune: str | None = None,
                 strict: bool = False, quiet: bool = False, stop_after_epochs: int | None = None,
                 command: str | None = None, overwrite: bool = False, lr_from_preset: bool = False,
                 precision: str = "auto", strategy: str = "ddp"):
        """`overwrite`: replace a finished run in `out` (refused otherwise). `lr_from_preset`: the lr was not
        chosen for this model (no --lr): refuse it when too high for a large model (recipes.check_preset_lr).
        `precision`: "auto" (the recipe's bf16 where the hardware has native bf16, else fp32), "bf16" or "fp32".
        `strategy`: "ddp" or "fsdp" (training/fsdp.py), for more than one process."""
        self.recipe, self.out, self.resume, self.finetune = derive(recipe, finetune), Path(out), resume, finetune
        self.precision = precision
        if strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"strategy must be ddp or fsdp, got {strategy!r}")
        self.strategy = strategy
        self.strict, self.quiet, self.stop_after_epochs = strict, quiet, stop_after_epochs
        self.overwrite, self.lr_from_preset = overwrite, lr_from_preset
        self.committed = False  # the first optimiser step ran: from here on a failure keeps the run folder
        self.command = command or " ".join(shlex.quote(a) for a in ["vitkit", *sys.argv[1:]])
        self.d = setup_distributed()
        self.device = torch.device(f"cuda:{self.d.local_rank}" if torch.cuda.is_available() else "cpu")
        self.run_dir = RunDir(self.out)

    def _console(self, always: bool = False):
        """stderr on the main process; silent with `quiet` unless `always` (the run's final line)."""
        from rich.console import Console

        return Console(stderr=True, quiet=(self.quiet and not always) or not self.d.main)

    def _threads(self) -> int | None:
        if self.recipe.threads:
            return self.recipe.threads
        if self.d.world > 1 and self.device.type == "cpu":  # ranks share the cores
            return max(1, (os.cpu_count() or 2) // int(os.environ.get("LOCAL_WORLD_SIZE", self.d.world)))
        return None

    # -- setup
    def _choose_precision(self) -> None:
        """Training in bf16 only where the hardware has native bf16, unless forced (vitkit.hardware): the
        recipe's `bf16` becomes what runs, so the tasks' autocast and config.json follow it."""
        self.decisions = decisions = this_machine(self.device.type)
        chosen, self.precision_note = choose_precision(self.precision, self.recipe.bf16, decisions)
        self.recipe = self.recipe.replace(bf16=chosen == "bf16")

    def setup(self) -> None:
        self._choose_precision()
        r, d = self.recipe, self.d
        torch.manual_seed(r.seed)
        # a folder or manifest without a val split gets one carved from train (recorded in the recipe and in
        # config.json's data.split_indices), so the best checkpoint is chosen on images it did not train on
        val_fraction = r.val_fraction or default_val_fraction(r.data)
        self.data: DataBundle = load_data(r.data, seed=r.seed, val_fraction=val_fraction, strict=self.strict,
                                          subset=r.train_subset)
        if val_fraction != r.val_fraction and "val_split" in self.data.info:
            self.data.info["val_split"]["auto"] = True
            self.recipe = r = r.replace(val_fraction=val_fraction)
        self.model = model_io.build(r, self.data.num_classes, self.data.channels, self.data.image_size, self.finetune)
        if self.lr_from_preset and not self.resume:
            check_preset_lr(r, sum(p.numel() for p in self.model.parameters()), self._model_name())
        self.model.class_names = self.data.class_names
        apply_fast_paths(self.model, self.decisions)  # the switches a layer has, set for this machine
        self.data.set_channels(model_io.in_chans(self.model))
        self.model.to(self.device)
        pre = self.model.preprocess
        self.train_set = Transformed(self.data.train, train_transform(pre, r, self.data.image_size), seed=r.seed)
        ev = eval_transform(pre)
        self.eval_split = "val" if self.data.val is not None else "test"
        self.eval_set = Transformed(self.data.val if self.data.val is not None else self.data.test, ev, deterministic=False)
        self.test_set = Transformed(self.data.test, ev, deterministic=False) if self.data.test is not None else None
        self.ema = make_ema(self.model, r.ema_decay) if r.ema else None
        self.net = self.model
        self.fsdp, self.plain, self.grad_divisor = False, None, 1
        if d.world > 1 and self.strategy == "fsdp":
            self._shard()
        elif d.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.net = DDP(self.model, device_ids=[d.local_rank] if self.device.type == "cuda" else None)
        if r.compile:
            self.net = torch.compile(self.net)
        self.task = make_task(r, net=self.net, model=self.model, num_classes=self.data.num_classes, device=self.device)
        self.task_params = [p for m in self.task.modules() for p in m.parameters() if p.requires_grad]
        groups = param_groups(self.model, r) + [g for m in self.task.modules() for g in param_groups(m, r)]
        self.optimizer = torch.optim.AdamW(groups, lr=r.lr, betas=tuple(r.betas))
        self.steps_per_epoch = len(epoch_batches(len(self.train_set), r, 0, d))
        self.total_steps = self.steps_per_epoch * r.epochs
        self.task.on_train_start(self.total_steps, self.steps_per_epoch)
        self.warmup_steps = round(r.warmup_epochs * self.steps_per_epoch)
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"epoch": 0}
        self.partial = {"loss_sum": 0.0, "count": 0, "seen": 0, "time": 0.0}
        self.wall_before = 0.0
        self.step_log: list[dict[str, Any]] = []
        if self.resume:
            self._load_resume()

    def _shard(self) -> None:
        """FSDP: shard the model over the ranks. Rank 0 keeps a whole replica for evaluation and checkpoints,
        loaded with the gathered weights at each epoch's end."""
        import copy

        from . import fsdp

        r = self.recipe
        fsdp.check_recipe(r)
        if self.d.main:
            self.plain = copy.deepcopy(self.model).eval()
        self.fsdp = True
        self.grad_divisor = fsdp.gradient_divisor(self.device, self.d.world, r.bf16)
        fsdp.shard(self.model, self.device, self.d.world, r.bf16)

    def _gather(self) -> tuple[dict, dict] | None:
        """FSDP: the whole weights and optimiser state on rank 0 (every rank must call this); else None."""
        if not self.fsdp:
            return None
        from .fsdp import full_state

        model_sd, optim_sd = full_state(self.model, self.optimizer)
        if self.plain is not None:
            self.plain.load_state_dict(model_sd)
        return model_sd, optim_sd

    def _load_resume(self) -> None:
        st = self.run_dir.load_state()
        info = st["info"]
        if self.fsdp:
            from .fsdp import load_full_state

            if self.plain is not None:  # first: loading into the sharded model turns the dict's tensors into shards
                self.plain.load_state_dict(st["model"])
            load_full_state(self.model, self.optimizer, st["model"], st["optimizer"])
        else:
            self.model.load_state_dict(st["model"])
            self.optimizer.load_state_dict(st["optimizer"])
        if self.ema is not None and st["ema"] is not None:
            self.ema.load_state_dict(st["ema"])
        self.task.load_state_dict(st["task"])
        if st["rng"] is not None:
            torch.set_rng_state(st["rng"])
        self.epoch, self.batch_in_epoch, self.step = info["epoch"], info["batch_in_epoch"], info["step"]
        self.history, self.best = info["history"], info["best"]
        self.partial, self.wall_before = info["partial"], info["wall_time_s"]
        if self.d.main:
            self.run_dir.reconcile(self.history, self.step)
            epochs = self.recipe.epochs
            where = (f"at epoch {self.epoch + 1}/{epochs}, step {self.step}/{self.total_steps}"
                     if self.epoch < epochs else f"after its last epoch ({self.epoch}/{count(epochs, 'epoch')}) "
                     "for the final evaluation and report")
            self._console().print(f"resuming {self.out} {where}", soft_wrap=True)

    def _save_state(self, gathered: tuple[dict, dict] | None = None) -> None:
        """Every rank calls this (FSDP gathers the state unless `gathered` holds it); rank 0 writes."""
        if self.fsdp and gathered is None:
            gathered = self._gather()
        if self.d.main:
            from .fsdp import SavedOptimizer

            info = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step,
                    "history": self.history, "best": self.best, "partial": self.partial,
                    "wall_time_s": self.wall_before + time.perf_counter() - self.t0, "recipe": self.recipe.name}
            model_sd, optimizer = ((gathered[0], SavedOptimizer(gathered[1])) if gathered
                                   else (self.model.state_dict(), self.optimizer))
            self.run_dir.save_state(model_sd=model_sd, optimizer=optimizer, info=info,
                                    ema_sd=self.ema.state_dict() if self.ema is not None else None,
                                    task_sd=self.task.state_dict())

    # -- the loop
    def run(self) -> dict[str, Any]:
        self.t0 = time.perf_counter()
        with torch_threads(self._threads()):
            return self._run()

    def _run(self) -> dict[str, Any]:
        if not self.resume and not self.overwrite and self.run_dir.finished():
            raise ConfigError(f"{self.out} holds a finished run (summary.json: done); pass --overwrite to replace "
                              "it, or choose another --out")
        if self.d.main:
            self._remove_stale_temps()
        if self.resume and self.run_dir.finished():
            return self._already_finished()
        self.setup()  # data and model first: a setup error leaves no run folder behind
        if self.d.main and not self.resume:
            self.run_dir.start(run_config(self.recipe, self.data, self.model, command=self.command, finetune=self.finetune,
                                          world=self.d.world, device=self.device))
        try:
            return self._train()
        except BaseException:
            if self.d.main and not self.resume and not self.committed:  # nothing trained: no half-written folder
                self.run_dir.discard()
            raise

    def _remove_stale_temps(self) -> None:
        """Temp files of this run's writers that a kill left behind (a state save can leave ~90 MB)."""
        removed, freed = self.run_dir.remove_stale_temps()
        if removed:
            from ..analysis.cost import format_bytes

            self._console().print(f"removed {count(removed, 'stale temp file')} ({format_bytes(freed)}) left by "
                                  f"interrupted writes in {self.out}", soft_wrap=True)

    def _already_finished(self) -> dict[str, Any]:
        """--resume of a run whose summary says done: one line, nothing trained or rewritten."""
        summary = self.run_dir.summary()
        done, epochs = summary.get("epochs", self.recipe.epochs), self.recipe.epochs
        if self.d.main:
            self._console(always=True).print(f"run {self.out} already finished ({done}/{count(epochs, 'epoch')}); "
                                             "nothing to do", soft_wrap=True)
        return summary

    def _train(self) -> dict[str, Any]:
        r = self.recipe
        barrier(self.d)
        console = self._console()
        if self.d.main and not self.resume:
            params = sum(p.numel() for p in self.model.parameters())
            name = r.name + (f" (based on {r.based_on})" if r.based_on else "")
            vs = self.data.info.get("val_split") or {}
            held = f", {vs['fraction']:.0%} of train held out" if vs.get("auto") else ""
            height, width = self.model.preprocess.input_size[1:]
            console.print(f"[bold]vitkit train[/] recipe {name}: {self._model_name()} ({params / 1e6:.2f}M params) on "
                          f"{self.data.name} ({len(self.data.train)} train / {len(self.eval_set)} {self.eval_split}"
                          f"{held}) at {height}x{width} px, {count(r.epochs, 'epoch')} x "
                          f"{count(self.steps_per_epoch, 'step')}, {count(self.d.world, 'process')}, {self.device}",
                          soft_wrap=True)
            if self.data.info.get("num_skipped"):
                console.print(f"[yellow]skipped {count(self.data.info['num_skipped'], 'unreadable image')}[/] "
                              "(listed in config.json)", soft_wrap=True)
        if self.d.main:
            console.print(f"precision {'bf16 autocast' if r.bf16 else 'fp32'}, "
                          f"{count(torch.get_num_threads(), 'torch thread')} per process", soft_wrap=True)
            if self.precision_note:
                console.print(self.precision_note, soft_wrap=True)
        self.eta_pending = self.d.main and self._heavy()
        if self.eta_pending:
            print_cost(console, self.model, micro_batch=max(1, r.batch_size // r.accum_steps // self.d.world),
                       bf16=r.bf16)
        self.eta = Eta(self.total_steps - self.step)
        # no bar where nothing is left to train (a resumed run that lacks only its final evaluation)
        no_bar = self.quiet or not self.d.main or self.epoch >= r.epochs
        with Interrupt() as interrupt, progress_bar(console, disable=no_bar) as progress:
            bar = progress.add_task(f"epoch {self.epoch + 1}/{r.epochs}", total=self.total_steps, completed=self.step,
                                    loss=float("nan"), lr=0.0, ips=0.0, eta="")
            while self.epoch < r.epochs:
                self._train_epoch(progress, bar, interrupt)
                self._end_epoch(console)
                if self.stop_after_epochs and self.stop_after_epochs <= self.epoch < r.epochs:
                    if self.d.main:
                        self._console(always=True).print(
                            f"stopped after epoch {self.epoch} as asked; continue with `vitkit train --out "
                            f"{self.out} --resume`", soft_wrap=True)
                    return {"status": "stopped", "epoch": self.epoch, "out": str(self.out)}
        return self._finish(console)

    def _heavy(self) -> bool:
        """Training on a CPU at HEAVY_SIDE px and up: worth a cost estimate and an ETA."""
        return self.device.type == "cpu" and min(self.model.preprocess.input_size[1:]) >= HEAVY_SIDE

    def _model_name(self) -> str:
        return self.recipe.model if not self.finetune else f"{self.model.provenance.get('arch') or 'model'} from {self.finetune}"

    def _train_epoch(self, progress, bar, interrupt) -> None:
        r, d = self.recipe, self.d
        self.train_set.epoch = self.epoch
        self.task.on_epoch_start(self.epoch)
        batches = epoch_batches(len(self.train_set), r, self.epoch, d)
        todo = [mb for step in batches[self.batch_in_epoch:] for mb in step]  # flat micro-batches
        loader = DataLoader(self.train_set, batch_sampler=todo, num_workers=r.workers,
                            persistent_workers=False, pin_memory=self.device.type == "cuda")
        min_ratio = r.min_lr / r.lr
        for m in [self.net, *self.task.modules()]:
            m.train()
        it = iter(loader)
        t_last = time.perf_counter()
        while self.batch_in_epoch < len(batches):
            factor = lr_factor(self.step, self.total_steps, self.warmup_steps, min_ratio)
            for g in self.optimizer.param_groups:
                g["lr"] = g["base_lr"] * factor
            # mixing, dropout, drop-path (CPU generator; CUDA kernels draw from their own, seeded at start)
            torch.default_generator.manual_seed(step_seed(r.seed, self.step, d.rank))
            loss_total, n_img = 0.0, 0
            for m in range(r.accum_steps):
                batch = to_device(next(it), self.device)
                sync = m == r.accum_steps - 1 or d.world == 1
                with self.net.no_sync() if (not sync and hasattr(self.net, "no_sync")) else nullcontext():
                    out = self.task(batch)
                    (out["loss"] / r.accum_steps).backward()
                loss_total += out["loss"].item() / r.accum_steps
                n_img += out.get("batch_size") or len(batch[0])
            if self.grad_divisor != 1:  # FSDP on a backend that summed instead of averaging (training/fsdp.py)
                from .fsdp import divide_grads

                divide_grads(self.model, self.grad_divisor)
            all_mean_grads(self.task_params, d)
            mean_loss, stop = all_mean([loss_total, float(interrupt.flag)], d, self.device)
            if not math.isfinite(mean_loss):
                self._diverged(mean_loss)
            if r.clip_grad:
                nn.utils.clip_grad_norm_([*self.model.parameters(), *self.task_params], r.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.ema is not None:
                self.ema.update_parameters(self.model)
            self.step += 1
            self.batch_in_epoch += 1
            self.task.after_step(self.step)
            now = time.perf_counter()
            p, lr = self.partial, self.optimizer.param_groups[0]["lr"]
            p["loss_sum"], p["count"] = p["loss_sum"] + mean_loss, p["count"] + 1
            p["seen"], p["time"] = p["seen"] + n_img * d.world, p["time"] + now - t_last
            self.step_log.append({"step": self.step, "loss": mean_loss, "lr": lr})
            self.committed = True
            self.eta.record(now - t_last)
            progress.update(bar, advance=1, loss=mean_loss, lr=lr, ips=n_img * d.world / max(now - t_last, 1e-9),
                            description=f"epoch {self.epoch + 1}/{r.epochs}", eta=self.eta.text())
            if self.eta_pending and self.eta.seconds_left() is not None:  # said once, after the warm-up
                self.eta_pending = False
                if self.eta.steps_left:
                    progress.console.print(self.eta.describe(), soft_wrap=True)
            t_last = now
            if stop:
                self._flush_steps()
                self._save_state()
                if d.main:
                    progress.stop()
                    print(f"vitkit train: interrupted at epoch {self.epoch + 1}, step {self.step}: saved a resumable "
                          f"state to {self.out / 'state.safetensors'}; continue with "
                          f"`vitkit train --out {self.out} --resume`", file=sys.stderr, flush=True)
                raise Interrupted

    def _diverged(self, value: float) -> None:
        last = self.out / "last.safetensors"
        keep = f"the last good checkpoint is {last} (epoch {self.epoch})" if last.exists() and self.epoch else \
            "no checkpoint had been saved yet"
        self.committed = True  # a result: the folder says what happened
        if self.d.main:
            self.run_dir.write_summary({"status": "diverged", "step": self.step + 1, "epoch": self.epoch + 1,
                                        "loss": str(value)})
        raise TrainingError(f"loss became {value} at step {self.step + 1} (epoch {self.epoch + 1}, batch "
                            f"{self.batch_in_epoch + 1}); stopped without saving; {keep}. Lower the lr "
                            f"(now {self.recipe.lr:g}) or keep clip_grad on")

    def _flush_steps(self) -> None:
        if self.d.main:
            self.run_dir.append_steps(self.step_log)
        self.step_log = []

    def _eval_model(self) -> nn.Module:
        if self.plain is not None:  # FSDP: rank 0's whole replica (loaded by _gather)
            return self.plain
        return self.ema.module if self.ema is not None else self.model

    def _evaluate(self, model: nn.Module, ds) -> dict[str, Any]:
        loader = DataLoader(ds, batch_size=self.recipe.eval_batch_size, shuffle=False, num_workers=self.recipe.workers)
        return self.task.evaluate(model, loader)

    def _end_epoch(self, console) -> None:
        r, p = self.recipe, self.partial
        rec: dict[str, Any] = {"epoch": self.epoch + 1, "step": self.step,
                               "train_loss": p["loss_sum"] / max(p["count"], 1),
                               "lr": self.optimizer.param_groups[0]["lr"] / self.optimizer.param_groups[0]["base_lr"] * r.lr,
                               "img_per_s": p["seen"] / max(p["time"], 1e-9), "train_time_s": p["time"]}
        res: dict[str, Any] = {}
        raw = None
        gathered = self._gather()  # FSDP: every rank takes part; rank 0's replica now holds the weights
        if self.d.main:
            res = self._evaluate(self._eval_model(), self.eval_set)
            rec |= {"eval_split": self.eval_split} | loggable(res, "eval_")
            if self.ema is not None and r.eval_raw:
                raw = self._evaluate(self.model, self.eval_set)
                rec |= loggable(raw, "raw_")
        self.history.append(rec)
        self.epoch += 1
        self.batch_in_epoch = 0
        self.partial = {"loss_sum": 0.0, "count": 0, "seen": 0, "time": 0.0}
        if self.d.main:
            prov = provenance(self.recipe, self.data.name, rec["epoch"], self.eval_split, res, self.command)
            self.run_dir.save_checkpoint(self._eval_model(), "last.safetensors", self.data.class_names, prov)
            self.run_dir.save_task_checkpoints(self.task, self.data.class_names, prov)  # e.g. DINO's teacher
            if "score" not in self.best or res["score"] > self.best["score"]:
                self.best = {"score": res["score"]} | loggable(res) | {"epoch": rec["epoch"], "split": self.eval_split}
                self.run_dir.save_checkpoint(self._eval_model(), "best.safetensors", self.data.class_names, prov)
            self._flush_steps()
            self._save_state(gathered)
            self.run_dir.write_metrics(self.history)
            console.print(f"epoch {rec['epoch']}/{r.epochs} loss {rec['train_loss']:.4f} {self.eval_split} "
                          f"{self.task.describe(res, raw)} {rec['img_per_s']:.0f} img/s",
                          overflow="ignore", crop=False, soft_wrap=True)
        barrier(self.d)

    def _finish(self, console) -> dict[str, Any]:
        r = self.recipe
        summary: dict[str, Any] = {}
        if self.d.main:
            final_set, final_split = ((self.test_set, "test") if self.test_set is not None
                                      else (self.eval_set, self.eval_split))
            res = self._evaluate(self._eval_model(), final_set)
            wall = self.wall_before + time.perf_counter() - self.t0
            seen = sum(h["img_per_s"] * h["train_time_s"] for h in self.history)
            train_time = sum(h["train_time_s"] for h in self.history)
            summary = {
                "status": "done", "out": str(self.out), "recipe": r.name,
                **({"based_on": r.based_on} if r.based_on else {}), "model": self._model_name(),
                "data": self.data.name, "command": self.command, "epochs": self.history[-1]["epoch"],
                "steps": self.step, "final": {"split": final_split} | loggable(res), "best": dict(self.best),
                "wall_time_s": wall, "train_time_s": train_time, "img_per_s": seen / max(train_time, 1e-9),
                "world_size": self.d.world, "strategy": "fsdp" if self.fsdp else "ddp" if self.d.world > 1 else None,
                "ema": r.ema, "precision": "bf16" if r.bf16 else "fp32",
                "threads": torch.get_num_threads(),
                **({"expected": r.expected} if r.expected else {}),  # a preset's own target, only on its own run
                "skipped_images": self.data.info.get("num_skipped", 0),
            }
            if self.eval_split == "val" and self.test_set is not None:  # the best-on-val model, on test
                best_model = model_io.load_any(self.out / "best.safetensors").to(self.device)
                summary["best"] |= loggable(self._evaluate(best_model, self.test_set), "test_")
            described = f"{final_split} {self.task.describe(res)}"
            figures = self.task.figures(self._eval_model(), final_set, self.out)
            report = self.run_dir.report(summary, self.history, res, self.data.class_names, described, figures)
            summary["report"] = str(report)
            self._console(always=True).print(  # also with --quiet: the one line that says where the result is
                f"[bold green]done[/]: final {described} after {count(summary['epochs'], 'epoch')} in {wall:.0f} s; "
                f"report: {report}", soft_wrap=True)
        barrier(self.d)
        return summary


def train(recipe: Recipe, out: str | os.PathLike, **kw) -> dict[str, Any]:
    trainer = Trainer(recipe, out, **kw)
    try:
        return trainer.run()
    finally:
        teardown()
