"""The training loop: one process or DDP (torchrun), resumable at any step, deterministic given the seed.

Determinism by construction, so that `--resume` and DDP reproduce a plain run:
- the data order of epoch e is a permutation seeded by (seed, e); a global batch is sliced across ranks
  and accumulation steps, so the set of images per optimiser step does not depend on the world size;
- augmentation randomness is seeded per (seed, epoch, image index) (data.datasets.Transformed);
- MixUp/CutMix, dropout and stochastic depth are seeded per (seed, step, rank) before each step;
- the LR is a function of the optimiser step, so the "scheduler state" is the step counter.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ..data.datasets import DataBundle, Transformed, load_data, sample_seed
from ..data.transforms import batch_mixer, eval_transform, train_transform
from ..errors import VitkitError
from . import models as model_io
from .evaluate import evaluate
from .recipes import Recipe
from .state import load_state, save_state

log = logging.getLogger("vitkit")


def _write_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError  # wraps the OS error (disk full, file too large)

        return (OSError, SafetensorError)
    except ImportError:
        return (OSError,)


_WRITE_ERRORS = _write_errors()


def _reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e)


class TrainingError(VitkitError):
    """Training stopped on purpose: a diverged loss, or a checkpoint that could not be written."""


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    d = Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if torch.cuda.is_available():
        torch.cuda.set_device(d.local_rank)
    return d


# ---------------------------------------------------------------------------- optimiser and schedule
def param_groups(model: nn.Module, recipe: Recipe) -> list[dict[str, Any]]:
    """AdamW groups: no decay on norms/biases/position embeddings/prefix tokens; layer-wise LR decay and a
    separate head LR when the recipe asks (ViT's `layer_id`)."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    use_lld = recipe.layer_decay is not None and recipe.layer_decay < 1 and hasattr(model, "layer_id")
    num_layers = len(model.blocks) + 1 if use_lld else 0
    groups: dict[tuple, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_wd = p.ndim <= 1 or name.endswith(".bias") or name in skip
        is_head = name.startswith(("head.", "head_dist.", "fc."))
        layer = model.layer_id(name) if use_lld else 0
        if is_head and recipe.head_lr is not None:
            base_lr = recipe.head_lr
        else:
            base_lr = recipe.lr * (recipe.layer_decay ** (num_layers - layer) if use_lld else 1.0)
        key = (no_wd, base_lr)
        g = groups.setdefault(key, {"params": [], "names": [], "weight_decay": 0.0 if no_wd else recipe.weight_decay,
                                    "base_lr": base_lr, "lr": base_lr})
        g["params"].append(p)
        g["names"].append(name)
    return list(groups.values())


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to `min_ratio` (per optimiser step)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_ema(model: nn.Module, decay: float):
    from torch.optim.swa_utils import AveragedModel

    def ema_update(ema_params, params, num_averaged):
        # warm-up of the decay (as timm's ModelEmaV3): early weights are not frozen in for thousands of steps
        n = float(num_averaged)
        d = min(decay, (1 + n) / (10 + n))
        torch._foreach_lerp_(ema_params, params, 1 - d)

    return AveragedModel(model, multi_avg_fn=ema_update, use_buffers=True)


# ---------------------------------------------------------------------------- data order
def epoch_batches(n: int, recipe: Recipe, epoch: int, d: Dist) -> list[list[list[int]]]:
    """Per optimiser step, this rank's micro-batches (lists of indices). Drops the incomplete last batch."""
    g = torch.Generator().manual_seed(recipe.seed * 1000 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    B, A = recipe.batch_size, recipe.accum_steps
    if B % (A * d.world):
        raise TrainingError(f"batch_size {B} must be divisible by accum_steps x processes = {A * d.world}")
    steps = n // B
    if recipe.steps_per_epoch:
        steps = min(steps, recipe.steps_per_epoch)
    if steps == 0:
        raise TrainingError(f"batch_size {B} is larger than the training set ({n} images): lower --batch-size")
    micro, per_rank = B // A, B // (A * d.world)
    out = []
    for s in range(steps):
        glob = perm[s * B:(s + 1) * B]
        out.append([glob[m * micro:(m + 1) * micro][d.rank * per_rank:(d.rank + 1) * per_rank] for m in range(A)])
    return out


class _Interrupt:
    """SIGINT sets a flag the loop checks between steps (so the saved state is consistent)."""

    def __init__(self):
        self.flag = False
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handle(self, signum, frame):
        if self.flag:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.flag = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


# ---------------------------------------------------------------------------- the run
class Trainer:
    def __init__(self, recipe: Recipe, out: str | os.PathLike, *, resume: bool = False, finetune: str | None = None,
                 strict: bool = False, quiet: bool = False, stop_after_epochs: int | None = None,
                 command: str | None = None):
        self.recipe, self.out, self.resume, self.finetune = recipe, Path(out), resume, finetune
        self.strict, self.quiet, self.stop_after_epochs = strict, quiet, stop_after_epochs
        self.command = command or " ".join(shlex.quote(a) for a in ["vitkit", *sys.argv[1:]])
        self.d = setup_distributed()
        self.device = torch.device(f"cuda:{self.d.local_rank}" if torch.cuda.is_available() else "cpu")

    # -- helpers
    def _console(self):
        from rich.console import Console

        return Console(stderr=True, quiet=self.quiet or not self.d.main)

    def _all_mean(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        if self.d.world > 1:
            dist.all_reduce(t)
            t /= self.d.world
        return t.tolist()

    def _barrier(self):
        if self.d.world > 1:
            dist.barrier()

    def _save_checkpoint(self, model, path: Path, provenance: dict) -> None:
        try:
            model_io.save(model, path, class_names=self.data.class_names, provenance=provenance)
        except _WRITE_ERRORS as e:
            raise TrainingError(f"could not write {path}: {_reason(e)}; the previous file is intact "
                                "(writes are atomic)") from None

    # -- setup
    def setup(self) -> None:
        r = self.recipe
        if r.threads:
            torch.set_num_threads(r.threads)
        elif self.d.world > 1 and self.device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("LOCAL_WORLD_SIZE", self.d.world))))
        torch.manual_seed(r.seed)
        self.data: DataBundle = load_data(r.data, seed=r.seed, val_fraction=r.val_fraction, strict=self.strict,
                                          subset=r.train_subset)
        self.model = model_io.build(r, self.data.num_classes, self.data.channels, self.data.image_size, self.finetune)
        self.model.class_names = self.data.class_names
        self.data.set_channels(model_io.in_chans(self.model))
        self.model.to(self.device)
        pre = self.model.preprocess
        self.train_set = Transformed(self.data.train, train_transform(pre, r, self.data.image_size), seed=r.seed)
        ev = eval_transform(pre)
        self.eval_split = "val" if self.data.val is not None else "test"
        self.eval_set = Transformed(self.data.val if self.data.val is not None else self.data.test, ev, deterministic=False)
        self.test_set = Transformed(self.data.test, ev, deterministic=False) if self.data.test is not None else None
        self.mixer = batch_mixer(r, self.data.num_classes)
        self.optimizer = torch.optim.AdamW(param_groups(self.model, r), lr=r.lr, betas=tuple(r.betas))
        self.ema = make_ema(self.model, r.ema_decay) if r.ema else None
        self.net = self.model
        if self.d.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.net = DDP(self.model, device_ids=[self.d.local_rank] if self.device.type == "cuda" else None)
        if r.compile:
            self.net = torch.compile(self.net)
        self.steps_per_epoch = len(epoch_batches(len(self.train_set), r, 0, self.d))
        self.total_steps = self.steps_per_epoch * r.epochs
        self.warmup_steps = round(r.warmup_epochs * self.steps_per_epoch)
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"top1": -1.0, "epoch": 0}
        self.partial = {"loss_sum": 0.0, "count": 0, "seen": 0, "time": 0.0}
        self.wall_before = 0.0
        self.step_log: list[dict[str, Any]] = []
        if self.resume:
            self._load_resume()

    def _load_resume(self) -> None:
        path = self.out / "state.safetensors"
        if not path.exists():
            raise TrainingError(f"{self.out}: nothing to resume (no state.safetensors)")
        st = load_state(path)
        info = st["info"]
        self.model.load_state_dict(st["model"])
        self.optimizer.load_state_dict(st["optimizer"])
        if self.ema is not None and st["ema"] is not None:
            self.ema.load_state_dict(st["ema"])
        if st["rng"] is not None:
            torch.set_rng_state(st["rng"])
        self.epoch, self.batch_in_epoch, self.step = info["epoch"], info["batch_in_epoch"], info["step"]
        self.history, self.best = info["history"], info["best"]
        self.partial, self.wall_before = info["partial"], info["wall_time_s"]
        if self.d.main:
            self._reconcile_logs()
            self._console().print(f"resuming {self.out} at epoch {self.epoch + 1}, step {self.step}")

    def _reconcile_logs(self) -> None:
        """A killed run may have flushed step lines past its saved state, or saved a state before appending
        its metrics line: rewrite both logs from the state so each epoch and step appears exactly once."""
        from .._files import atomic_write_text

        atomic_write_text(self.out / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in self.history))
        steps, seen = [], set()
        path = self.out / "steps.jsonl"
        for line in (path.read_text().splitlines() if path.exists() else []):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if rec["step"] <= self.step and rec["step"] not in seen:
                seen.add(rec["step"])
                steps.append(line + "\n")
        atomic_write_text(path, "".join(steps))

    def _save_state(self) -> None:
        if not self.d.main:
            return
        info = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step,
                "history": self.history, "best": self.best, "partial": self.partial,
                "wall_time_s": self.wall_before + time.perf_counter() - self.t0, "recipe": self.recipe.name}
        try:
            save_state(self.out / "state.safetensors", model_sd=self.model.state_dict(), optimizer=self.optimizer,
                       ema_sd=self.ema.state_dict() if self.ema is not None else None, info=info)
        except _WRITE_ERRORS as e:
            raise TrainingError(f"could not write {self.out / 'state.safetensors'}: {_reason(e)}; the previous "
                                "state is intact (writes are atomic)") from None

    def _write_config(self) -> None:
        from .. import __version__

        data = self.data.summary() | {"split_indices": self.data.info.get("split_indices")}
        cfg = {"recipe": self.recipe.to_dict(), "data": data, "command": self.command, "finetune": self.finetune,
               "model": getattr(self.model, "arch_config", None) or self.model.cfg.to_dict(),
               "preprocess": self.model.preprocess.to_dict(), "class_names": self.data.class_names,
               "world_size": self.d.world, "device": str(self.device), "vitkit": __version__,
               "torch": torch.__version__}
        from .._files import atomic_write_text

        atomic_write_text(self.out / "config.json", json.dumps(cfg, indent=2, default=str))

    # -- the loop
    def run(self) -> dict[str, Any]:
        self.t0 = time.perf_counter()
        self.setup()
        r = self.recipe
        if self.d.main:
            self.out.mkdir(parents=True, exist_ok=True)
            if not self.resume:
                self._write_config()
                (self.out / "metrics.jsonl").write_text("")
                (self.out / "steps.jsonl").write_text("")
        self._barrier()
        console = self._console()
        if self.d.main and not self.resume:
            params = sum(p.numel() for p in self.model.parameters())
            console.print(f"[bold]vitkit train[/] recipe {r.name}: {self._model_name()} ({params / 1e6:.2f}M params) on "
                          f"{self.data.name} ({len(self.data.train)} train / {len(self.eval_set)} {self.eval_split}), "
                          f"{r.epochs} epochs x {self.steps_per_epoch} steps, {self.d.world} process(es), {self.device}")
            if self.data.info.get("num_skipped"):
                console.print(f"[yellow]skipped {self.data.info['num_skipped']} unreadable image(s)[/] (listed in config.json)")
        stopped_early = False
        with _Interrupt() as interrupt, self._progress(console) as progress:
            task = progress.add_task("train", total=self.total_steps, completed=self.step, loss=float("nan"), lr=0.0, ips=0.0)
            while self.epoch < r.epochs:
                self._train_epoch(progress, task, interrupt)
                self._end_epoch(console)
                if self.stop_after_epochs and self.epoch >= self.stop_after_epochs and self.epoch < r.epochs:
                    stopped_early = True
                    break
        if stopped_early:
            if self.d.main:
                console.print(f"stopped after epoch {self.epoch} as asked; continue with --resume")
            return {"status": "stopped", "epoch": self.epoch, "out": str(self.out)}
        return self._finish(console)

    def _model_name(self) -> str:
        return self.recipe.model if not self.finetune else f"{self.model.provenance.get('arch') or 'model'} from {self.finetune}"

    def _progress(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}  {task.fields[ips]:.0f} img/s"),
                        TimeRemainingColumn(), console=console, disable=self.quiet or not self.d.main, transient=False)

    def _train_epoch(self, progress, task, interrupt) -> None:
        r, d = self.recipe, self.d
        self.train_set.epoch = self.epoch
        batches = epoch_batches(len(self.train_set), r, self.epoch, d)
        todo = [mb for step in batches[self.batch_in_epoch:] for mb in step]  # flat micro-batches
        loader = DataLoader(self.train_set, batch_sampler=todo, num_workers=r.workers,
                            persistent_workers=False, pin_memory=self.device.type == "cuda")
        mixing = self.mixer is not None and self.epoch < r.epochs - r.mix_off_epochs
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=r.bf16)
        min_ratio = r.min_lr / r.lr
        self.net.train()
        it = iter(loader)
        t_last = time.perf_counter()
        while self.batch_in_epoch < len(batches):
            factor = lr_factor(self.step, self.total_steps, self.warmup_steps, min_ratio)
            for g in self.optimizer.param_groups:
                g["lr"] = g["base_lr"] * factor
            # mixing, dropout, drop-path (CPU generator; CUDA kernels draw from their own, seeded at start)
            torch.default_generator.manual_seed(sample_seed(r.seed, self.step, 1_000_000 + d.rank))
            loss_total = 0.0
            n_img = 0
            for m in range(r.accum_steps):
                x, y = next(it)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                if mixing:
                    x, y = self.mixer(x, y)  # y: [B, K] soft targets
                sync = m == r.accum_steps - 1 or d.world == 1
                ctx = self.net.no_sync() if (not sync and hasattr(self.net, "no_sync")) else nullcontext()
                with ctx:
                    with autocast:
                        logits = self.net(x)
                    loss = F.cross_entropy(logits.float(), y, label_smoothing=r.label_smoothing)
                    if r.inject_nan_step is not None and self.step == r.inject_nan_step:
                        loss = loss * float("nan")  # testing aid: the divergence path end to end
                    (loss / r.accum_steps).backward()
                loss_total += loss.item() / r.accum_steps
                n_img += len(x)
            mean_loss, stop = self._all_mean([loss_total, float(interrupt.flag)])
            if not math.isfinite(mean_loss):
                self._diverged(mean_loss)
            if r.clip_grad:
                nn.utils.clip_grad_norm_(self.model.parameters(), r.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.ema is not None:
                self.ema.update_parameters(self.model)
            self.step += 1
            self.batch_in_epoch += 1
            now = time.perf_counter()
            self.partial["loss_sum"] += mean_loss
            self.partial["count"] += 1
            self.partial["seen"] += n_img * d.world
            self.partial["time"] += now - t_last
            self.step_log.append({"step": self.step, "loss": mean_loss, "lr": self.optimizer.param_groups[0]["lr"]})
            ips = n_img * d.world / max(now - t_last, 1e-9)
            t_last = now
            progress.update(task, advance=1, loss=mean_loss, lr=self.optimizer.param_groups[0]["lr"], ips=ips,
                            description=f"epoch {self.epoch + 1}/{r.epochs}")
            if stop:
                self._flush_steps()
                self._save_state()
                if d.main:
                    progress.stop()
                    print(f"vitkit train: interrupted at epoch {self.epoch + 1}, step {self.step}: saved a resumable "
                          f"state to {self.out / 'state.safetensors'}; continue with "
                          f"`vitkit train --out {self.out} --resume`", file=sys.stderr, flush=True)
                raise KeyboardInterrupt

    def _diverged(self, value: float) -> None:
        last = self.out / "last.safetensors"
        keep = f"the last good checkpoint is {last} (epoch {self.epoch})" if last.exists() and self.epoch else \
            "no checkpoint had been saved yet"
        if self.d.main:
            with open(self.out / "summary.json", "w") as f:
                json.dump({"status": "diverged", "step": self.step + 1, "epoch": self.epoch + 1, "loss": str(value)}, f)
        raise TrainingError(f"loss became {value} at step {self.step + 1} (epoch {self.epoch + 1}, batch "
                            f"{self.batch_in_epoch + 1}); stopped without saving; {keep}. Lower the lr "
                            f"(now {self.recipe.lr:g}) or keep clip_grad on")

    def _flush_steps(self) -> None:
        """Per-step loss and LR -> steps.jsonl (the DDP and resume tests compare these)."""
        if self.d.main and self.step_log:
            with open(self.out / "steps.jsonl", "a") as f:
                f.writelines(json.dumps(s) + "\n" for s in self.step_log)
        self.step_log = []

    def _eval_model(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.model

    def _loader(self, ds):
        return DataLoader(ds, batch_size=self.recipe.eval_batch_size, shuffle=False, num_workers=self.recipe.workers)

    def _end_epoch(self, console) -> None:
        r = self.recipe
        p = self.partial
        rec: dict[str, Any] = {"epoch": self.epoch + 1, "step": self.step,
                               "train_loss": p["loss_sum"] / max(p["count"], 1),
                               "lr": self.optimizer.param_groups[0]["lr"] / self.optimizer.param_groups[0]["base_lr"] * r.lr,
                               "img_per_s": p["seen"] / max(p["time"], 1e-9), "train_time_s": p["time"]}
        if self.d.main:
            res = evaluate(self._eval_model(), self._loader(self.eval_set), self.data.num_classes, self.device, r.bf16)
            rec |= {"eval_split": self.eval_split, "eval_top1": res["top1"], "eval_top5": res["top5"],
                    "eval_loss": res["loss"]}
            if self.ema is not None and r.eval_raw:
                raw = evaluate(self.model, self._loader(self.eval_set), self.data.num_classes, self.device, r.bf16)
                rec["raw_top1"] = raw["top1"]
        self.history.append(rec)
        self.epoch += 1
        self.batch_in_epoch = 0
        self.partial = {"loss_sum": 0.0, "count": 0, "seen": 0, "time": 0.0}
        if self.d.main:
            prov = self._provenance(rec)
            self._save_checkpoint(self._eval_model(), self.out / "last.safetensors", prov)
            if rec["eval_top1"] > self.best["top1"]:
                self.best = {"top1": rec["eval_top1"], "top5": rec["eval_top5"], "epoch": rec["epoch"],
                             "split": self.eval_split}
                self._save_checkpoint(self._eval_model(), self.out / "best.safetensors", prov)
            self._flush_steps()
            self._save_state()
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            extra = f" (raw {rec['raw_top1']:.2f})" if "raw_top1" in rec else ""
            console.print(f"epoch {rec['epoch']}/{r.epochs} loss {rec['train_loss']:.4f} {self.eval_split} top-1 "
                          f"{rec['eval_top1']:.2f}%{extra} top-5 {rec['eval_top5']:.2f}% {rec['img_per_s']:.0f} img/s",
                          overflow="ignore", crop=False, soft_wrap=True)
        self._barrier()

    def _provenance(self, rec: dict[str, Any]) -> dict[str, Any]:
        from .. import __version__

        return {"recipe": self.recipe.name, "dataset": self.data.name, "epochs": rec["epoch"],
                "accuracy": {f"{rec['eval_split']}_top1": round(rec["eval_top1"], 3),
                             f"{rec['eval_split']}_top5": round(rec["eval_top5"], 3)},
                "command": self.command, "vitkit": __version__, "ema": self.recipe.ema,
                "trained_at": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def _finish(self, console) -> dict[str, Any]:
        from .report import plot_confusion, plot_curves, write_report

        r = self.recipe
        summary: dict[str, Any] = {}
        if self.d.main:
            final_set = self.test_set if self.test_set is not None else self.eval_set
            final_split = "test" if self.test_set is not None else self.eval_split
            res = evaluate(self._eval_model(), self._loader(final_set), self.data.num_classes, self.device, r.bf16)
            last = self.history[-1]
            wall = self.wall_before + time.perf_counter() - self.t0
            seen = sum(h["img_per_s"] * h["train_time_s"] for h in self.history)
            train_time = sum(h["train_time_s"] for h in self.history)
            summary = {
                "status": "done", "out": str(self.out), "recipe": r.name, "model": self._model_name(),
                "data": self.data.name, "command": self.command, "epochs": last["epoch"], "steps": self.step,
                "final": {"split": final_split, "top1": res["top1"], "top5": res["top5"], "loss": res["loss"]},
                "best": dict(self.best),
                "wall_time_s": wall, "train_time_s": train_time, "img_per_s": seen / max(train_time, 1e-9),
                "world_size": self.d.world, "ema": r.ema, "expected": r.expected,
                "skipped_images": self.data.info.get("num_skipped", 0),
            }
            if self.eval_split == "val" and self.test_set is not None:  # the best-on-val model, on test
                from .models import load_any

                best_model = load_any(self.out / "best.safetensors").to(self.device)
                bres = evaluate(best_model, self._loader(self.test_set), self.data.num_classes, self.device, r.bf16)
                summary["best"] |= {"test_top1": bres["top1"], "test_top5": bres["top5"]}
            plot_curves(self.history, self.out / "curves.png")
            plot_confusion(res["confusion"], self.data.class_names, self.out / "confusion.png",
                           f"{final_split} top-1 {res['top1']:.2f}%")
            with open(self.out / "summary.json", "w") as f:
                json.dump(summary, f, indent=2)
            report = write_report(self.out, summary)
            summary["report"] = str(report)
            console.print(f"[bold green]done[/]: final {final_split} top-1 {res['top1']:.2f}%, top-5 {res['top5']:.2f}% "
                          f"after {last['epoch']} epochs in {wall:.0f} s; report: {report}")
        self._barrier()
        return summary


def train(recipe: Recipe, out: str | os.PathLike, **kw) -> dict[str, Any]:
    trainer = Trainer(recipe, out, **kw)
    try:
        return trainer.run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
