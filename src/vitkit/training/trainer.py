"""The training loop: one trainable module (the task: model + heads) over one process, DDP or FSDP, resumable
at any step, deterministic given the seed. It only orders the work: what is learnt is the task's (tasks/),
how it runs over processes the strategy's (strategy.py), what is said the Reporter's (console.py), how long
it runs RunLength's (budget.py); data order in order.py; optimiser groups, LR schedule, EMA in optim.py; the
run folder in rundir.py; runs needed first (a teacher) in pipeline.py."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from ..data.transforms import collate
from ..errors import ConfigError
from ..hardware import apply_fast_paths, choose_precision, this_machine
from ..runtime import torch_threads
from . import flexi, memory_format, token_budget
from . import models as model_io
from .budget import RunLength
from .build import build_run, model_name
from .console import Reporter
from .distributed import Interrupt, Interrupted, all_mean, barrier, main_value, setup_distributed
from .optim import lr_factor, make_ema, param_groups
from .order import epoch_batches, step_seed
from .recipes import Recipe, derive
from .rundir import RunDir, TrainingError, provenance, run_config, run_summary
from .state import Progress
from .strategy import make_strategy
from .tasks import loggable, make_task, to_device

__all__ = ["Interrupted", "Trainer", "TrainingError"]

class Trainer:
    def __init__(self, recipe: Recipe, out: str | os.PathLike, *, resume: bool = False, finetune: str | None = None,
                 strict: bool = False, quiet: bool = False, stop_after_epochs: int | None = None,
                 command: str | None = None, overwrite: bool = False, lr_from_preset: bool = False,
                 precision: str = "auto", strategy: str = "ddp", reporter: Reporter | None = None):
        """`overwrite` a finished run in `out`; `lr_from_preset`: no --lr (build.build_run's check_lr);
        `precision`: "auto" (the recipe's bf16 where the hardware has native bf16), "bf16" or "fp32"; `strategy`
        for more than one process (strategy.py); `command`: what the run records as its command."""
        self.recipe, self.out, self.resume, self.finetune = derive(recipe, finetune), Path(out), resume, finetune
        self.precision, self.strict, self.stop_after_epochs = precision, strict, stop_after_epochs
        self.overwrite, self.lr_from_preset = overwrite, lr_from_preset
        self.committed = False  # the first optimiser step ran: from here on a failure keeps the run folder
        self.command = command or f"vitkit.training.pipeline.train(recipe {self.recipe.name!r}, out {str(out)!r})"
        self.d = setup_distributed()
        self.device = torch.device(f"cuda:{self.d.local_rank}" if torch.cuda.is_available() else "cpu")
        self.strategy = make_strategy(strategy, self.d, self.device)
        self.say = (reporter or Reporter(quiet=quiet)) if self.d.main else Reporter(silent=True)
        self.run_dir = RunDir(self.out)

    def setup(self) -> None:
        # bf16 only where the hardware has native bf16, unless forced (vitkit.hardware): the recipe's `bf16`
        # becomes what runs, so the task's autocast and config.json follow it
        self.decisions = this_machine(self.device.type)
        chosen, self.precision_note = choose_precision(self.precision, self.recipe.bf16, self.decisions)
        torch.manual_seed(self.recipe.seed)
        parts = build_run(self.recipe.replace(bf16=chosen == "bf16"), finetune=self.finetune, strict=self.strict,
                          device=self.device, check_lr=self.lr_from_preset and not self.resume)
        vars(self).update(vars(parts))  # recipe, data, model, train_set, eval_set, eval_split, test_set
        r, model = self.recipe, self.model
        self.ema = make_ema(model, r.ema_decay) if r.ema else None
        self.task = make_task(r, model, num_classes=self.data.num_classes, device=self.device).to(self.device)
        flexi.check(model, self.task, r.flexi_patch_sizes)
        token_budget.check(model, self.task, r)
        # the convolutions' weight order, timed on this task where it has convolutions (memory_format.py)
        self.decisions = memory_format.decide(self.task, self.train_set, self.decisions, bf16=r.bf16,
                                              batch_size=max(1, r.batch_size // r.accum_steps // self.d.world),
                                              device=self.device, world=self.d.world, collate=collate)
        # the switches every trainable layer has, set for this machine, and that order
        apply_fast_paths(self.task, self.decisions, training=True)
        if r.compile:
            model.compile()  # in place: the state dict keeps its keys
        self.net = self.strategy.wrap(self.task)  # the optimiser is built on what the strategy made of it
        groups = param_groups(model, r) + [g for m in self.task.heads() for g in param_groups(m, r)]
        # fused: one kernel for all parameters (the loop form took 2.6 ms a step of the fashion-mnist-conv ViT's
        # 175 ms on a 2-core Zen 4, fused 0.5 ms; vitkit bench's training rows time this form); sharded (DTensor)
        # parameters keep the loop form
        fused = not any(isinstance(p.data, DTensor) for g in groups for p in g["params"])
        self.optimizer = torch.optim.AdamW(groups, lr=r.lr, betas=tuple(r.betas), fused=fused)
        self.steps_per_epoch = len(epoch_batches(len(self.train_set), r, 0, self.d))
        self.warmup_steps = round(r.warmup_epochs * self.steps_per_epoch)
        self.at = (self.run_dir.load_run(self.strategy, self.optimizer, self.ema, self.task) if self.resume
                   else Progress())
        self.step_log: list[dict[str, Any]] = []
        n_final = len(self.test_set or self.eval_set) * (2 if self.eval_split == "val" and self.test_set else 1)
        self.length = RunLength(r, self.steps_per_epoch, self.task, world=self.d.world, n_eval=len(self.eval_set),
                                n_final=n_final, plan=self.at.plan)
        self.at.plan = self.length.plan
        if self.resume:
            self.say.resumed(self.out, self.at, self.length.epochs, self.length.total_steps)

    def _replan(self, planned: int | None, bar) -> None:
        """Every rank calls it where a time budget's plan may come: the main process's plan, for all."""
        if planned is not None:
            before = self.length.total_steps
            self.length.set(main_value(planned, self.d, self.device))
            if self.length.total_steps != before:  # said when the plan is made or changes, not at each check
                bar.replan(self.length.total_steps, self.at.step, self.length.epochs)
                self.say.planned(self.length.plan)

    def _save_state(self, gathered: tuple[dict, dict] | None = None) -> None:
        self.run_dir.save_run(self.strategy, self.optimizer, self.ema, self.task,
                              self.at.info(self._elapsed(), self.recipe.name), gathered)

    # -- the loop
    def run(self) -> dict[str, Any]:
        self.t0 = time.perf_counter()
        with torch_threads(self.strategy.threads(self.recipe.threads)):
            if self.run_dir.finished() and not self.resume and not self.overwrite:
                raise ConfigError(f"{self.out} holds a finished run (summary.json: done); pass --overwrite to "
                                  "replace it, or choose another --out")
            if self.d.main:  # a kill left a writer's temp file behind (a state save can leave ~90 MB)
                self.say.stale_temps(*self.run_dir.remove_stale_temps(), self.out)
            if self.resume and self.run_dir.finished():
                return self.say.already_finished(self.out, self.run_dir.summary(), self.recipe.epochs)
            self.setup()  # data and model first: a setup error leaves no run folder behind
            if self.d.main and not self.resume:
                self.run_dir.start(run_config(self.recipe, self.data, self.model, command=self.command,
                                              finetune=self.finetune, world=self.d.world, device=self.device))
            try:
                return self._train()
            except BaseException:
                if self.d.main and not self.resume and not self.committed:  # nothing trained: no half-written folder
                    self.run_dir.discard()
                raise

    def _train(self) -> dict[str, Any]:
        r, say, at = self.recipe, self.say, self.at
        barrier(self.d)
        if not self.resume:
            say.start(r.name + (f" (based on {r.based_on})" if r.based_on else ""),
                      model_name(r, self.model, self.finetune), sum(p.numel() for p in self.model.parameters()),
                      self.data, len(self.eval_set), self.eval_split, self.model.preprocess.input_size[1:], self.length.describe(),
                      self.steps_per_epoch, self.d.world, self.device)
        say.precision(r.bf16, torch.get_num_threads(), self.precision_note)
        heavy = say.heavy(self.model, self.device, max(1, r.batch_size // r.accum_steps // self.d.world), r.bf16)
        length = self.length
        with Interrupt() as interrupt, say.progress(length.total_steps, at.step, at.epoch, length.epochs, heavy) as bar:
            while at.epoch < self.length.epochs:
                self._train_epoch(bar, interrupt)
                self._end_epoch(bar)
                if self.stop_after_epochs and self.stop_after_epochs <= at.epoch < self.length.epochs:
                    say.stopped(self.out, at.epoch)
                    return {"status": "stopped", "epoch": at.epoch, "out": str(self.out)}
        return self._finish()

    def _train_epoch(self, bar, interrupt) -> None:
        r, d, at = self.recipe, self.d, self.at
        self.train_set.epoch = at.epoch
        self.task.on_epoch_start(at.epoch)
        batches = epoch_batches(len(self.train_set), r, at.epoch, d)
        todo = [mb for step in batches[at.batch_in_epoch:] for mb in step]  # flat micro-batches
        it = iter(DataLoader(self.train_set, batch_sampler=todo, num_workers=r.workers, persistent_workers=False,
                             pin_memory=self.device.type == "cuda", collate_fn=collate))
        self.net.train()
        t_last = time.perf_counter()
        while at.batch_in_epoch < len(batches) and at.step < self.length.total_steps:  # a budget may cut it
            factor = lr_factor(at.step, self.length.total_steps, self.warmup_steps, r.min_lr / r.lr)
            for g in self.optimizer.param_groups:
                g["lr"] = g["base_lr"] * factor
            # mixing, dropout, drop-path (CPU generator; CUDA kernels draw from their own, seeded at start)
            torch.default_generator.manual_seed(step_seed(r.seed, at.step, d.rank))
            loss_total, n_img = 0.0, 0
            for m in range(r.accum_steps):
                batch = to_device(next(it), self.device)
                with self.strategy.no_sync(self.net, m == r.accum_steps - 1), \
                        flexi.cutting(self.model, r.flexi_patch_sizes, r.seed, at.step):
                    out = self.net(batch)
                    (out["loss"] / r.accum_steps).backward()
                loss_total += out["loss"].item() / r.accum_steps
                n_img += out.get("batch_size") or len(batch[0])
            self.strategy.after_backward()
            mean_loss, stop = all_mean([loss_total, float(interrupt.flag)], d, self.device)
            if not math.isfinite(mean_loss):
                self.committed = True  # a result: the folder says what happened
                raise self.run_dir.diverged(mean_loss, at, self.recipe.lr, write=self.d.main)
            if r.clip_grad:
                nn.utils.clip_grad_norm_(self.task.parameters(), r.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.ema is not None:
                self.ema.update_parameters(self.model)
            now, lr = time.perf_counter(), self.optimizer.param_groups[0]["lr"]
            at.add_step(mean_loss, n_img * d.world, now - t_last)
            self.committed = True
            self.task.after_step(at.step)
            self.step_log.append({"step": at.step, "loss": mean_loss, "lr": lr})
            bar.step(mean_loss, lr, n_img * d.world / max(now - t_last, 1e-9), at.epoch, now - t_last)
            self._replan(self.length.after_step(now - t_last, at.step, self._elapsed()), bar)
            t_last = now
            if stop:
                self._flush_steps()
                self._save_state()
                bar.stop()
                self.say.interrupted(self.out, at)
                raise Interrupted

    def _flush_steps(self) -> None:
        if self.d.main:
            self.run_dir.append_steps(self.step_log)
        self.step_log = []

    def _elapsed(self) -> float:  # wall seconds of the run so far, the processes before this one's included
        return self.at.wall_time_s + time.perf_counter() - self.t0

    def _eval_model(self) -> nn.Module:
        return self.strategy.eval_model(self.ema.module if self.ema is not None else self.model)

    def _evaluate(self, model: nn.Module, ds) -> dict[str, Any]:
        self.task.eval()
        model.eval()
        loader = DataLoader(ds, batch_size=self.recipe.eval_batch_size, shuffle=False, num_workers=self.recipe.workers,
                            collate_fn=collate)
        return self.task.evaluate(model, loader)

    def _end_epoch(self, bar) -> None:
        r, at, group = self.recipe, self.at, self.optimizer.param_groups[0]
        rec = at.close_epoch(lr=group["lr"] / group["base_lr"] * r.lr)
        gathered = self.strategy.gather(self.optimizer)  # every rank takes part where the state is sharded
        res, raw, t_eval = {}, None, time.perf_counter()
        if self.d.main:
            res = self._evaluate(self._eval_model(), self.eval_set)
            rec |= {"eval_split": self.eval_split} | loggable(res, "eval_")
            raw = self._evaluate(self.model, self.eval_set) if self.ema is not None and r.eval_raw else None
            rec |= loggable(raw or {}, "raw_")
        self._replan(self.length.after_epoch(rec["epoch"], time.perf_counter() - t_eval, at.step, self._elapsed(),
                                             rec["step_time_s"]), bar)
        if self.d.main:
            prov = provenance(r, self.data.name, rec["epoch"], self.eval_split, res, self.command)
            self.run_dir.save_checkpoint(self._eval_model(), "last.safetensors", self.data.class_names, prov)
            self.run_dir.save_task_checkpoints(self.task, self.data.class_names, prov)  # e.g. DINO's teacher
            if "score" not in at.best or res["score"] > at.best["score"]:
                at.best = {"score": res["score"]} | loggable(res) | {"epoch": rec["epoch"], "split": self.eval_split}
                self.run_dir.save_checkpoint(self._eval_model(), "best.safetensors", self.data.class_names, prov)
            self._flush_steps()
            self._save_state(gathered)
            self.run_dir.write_metrics(at.history)
            self.say.epoch(rec, self.length.epochs, self.eval_split, self.task.describe(res, raw))
        barrier(self.d)

    def _finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {}
        if self.d.main:
            final_set, final_split = ((self.test_set, "test") if self.test_set is not None
                                      else (self.eval_set, self.eval_split))
            res = self._evaluate(self._eval_model(), final_set)
            summary = run_summary(self.recipe, self.data, self.at.history, out=self.out, command=self.command,
                                  model=model_name(self.recipe, self.model, self.finetune), steps=self.at.step,
                                  final_split=final_split, final=res, best=self.at.best, world=self.d.world,
                                  wall=self._elapsed(), strategy=self.strategy.name,
                                  budget=self.at.plan.to_dict() if self.at.plan else None)
            if self.eval_split == "val" and self.test_set is not None:  # the best-on-val model, on test
                best_model = model_io.load_any(self.out / "best.safetensors").to(self.device)
                summary["best"] |= loggable(self._evaluate(best_model, self.test_set), "test_")
            described = f"{final_split} {self.task.describe(res)}"
            figures = self.task.figures(self._eval_model(), final_set, self.out)
            report = self.run_dir.report(summary, self.at.history, res, self.data.class_names, described, figures)
            summary["report"] = str(report)
            self.say.done(described, summary["epochs"], summary["wall_time_s"], report)
        barrier(self.d)
        return summary
