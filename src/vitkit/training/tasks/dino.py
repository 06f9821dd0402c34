"""DINO self-distillation (Caron et al. 2021, facebookresearch/dino `main_dino.py`) as a training objective.

The student is the model being trained (what the run saves, ready for `--finetune` or `vitkit eval --protocol
knn|linear`) plus its DINO head (layers.dino_head; trained with it: `modules()`). The teacher is an EMA of
both: a copy of the model and of the head, never trained by gradients, updated after every optimiser step
θt <- m θt + (1 - m) θs over all parameters (buffers are not averaged), m following DINO's
`cosine_scheduler(momentum_teacher -> 1)` over all the run's steps. Its encoder runs in eval mode (no
drop-path), its head in train mode (see "Small data" below).

Per batch (labels ignored): 2 global + N local crops of each image, made on the batch by data.multicrop
(the DataLoader yields already-transformed tensors; see there); the ViT resamples its positions for the
smaller local crops. The student sees every crop, the teacher only the 2 global ones. Loss (DINOLoss):
the student's outputs / τs (0.1) against the teacher's softmax((t - centre) / τt), cross-entropy summed over
the (teacher view, student view) pairs of different views, each averaged over the batch, divided by the
number of pairs (2 N_crops - 2). The centre then moves to 0.9 centre + 0.1 mean(teacher outputs), the mean
all-reduced across processes under torchrun. τt warms up linearly from `warmup_teacher_temp` to
`teacher_temp` over `warmup_teacher_temp_epochs` (per epoch, np.linspace as DINO). The last head layer's
gradients are cancelled for the first `freeze_last_layer` epochs (DINO sets them to None; here they are
zeroed, so AdamW's decoupled weight decay still scales weight_v, which the weight normalisation ignores).

state.safetensors keeps the student head, the teacher (model and head) and the centre, so --resume continues
exactly. Evaluation (cheap and honest): the DINO loss on the eval split with fixed crops (seeded, the
current centre and τt), and the weighted k-NN top-1 (k = 20, T = 0.07, probe.knn_scores) of the frozen
features of the student (the model given) and of the teacher, leave-one-out within the eval split (each
image's neighbours are the other eval images). "score" is the student's k-NN top-1 (the checkpoint saved is
the student's), -loss without labels (a single class). `vitkit eval --protocol knn` gives the DINO
protocol proper (the train split as the bank).

Small data. The defaults are for small images and short runs, not DINO's ImageNet values (in brackets):
global crops of area (0.7, 1), local (0.2, 0.5) (Gani et al. 2022, "How to train ViT on small-scale datasets",
at 32 px) [(0.4, 1), (0.05, 0.4) at 224 / 96 px with 8 local crops]; a head with BatchNorm, 256 hidden units,
a 64-d bottleneck and 256 prototypes [no BN, 2048, 256, 65536]; teacher momentum 0.99 [0.996]. Why, measured
on digits (vit_pico_patch2_8, one thread, ~150 steps; docs/small-data.md; tests/test_dino.py checks it):
- DINO's ViT head (no BN) collapsed at once: a freshly initialised encoder maps 8x8 digits to nearly parallel
  features, so the teacher's outputs differed between images by ~1e-3 (std over the batch), the centre removed
  the rest, and the targets softmax((t - c) / 0.04) were uniform from the first step: loss ln(K) for good,
  frozen-feature k-NN at the random encoder's ~24%. A BatchNorm in the head normalises each hidden unit over
  the batch, so the differences between images survive: teacher std ~0.09, targets far from uniform.
- The teacher head runs in train mode, as DINO's teacher: its BatchNorm uses the batch's statistics (an
  eval-mode teacher would use running statistics that no gradient or EMA ever sets: BN would be a no-op).
- With 1024 prototypes for ~1,400 images the loss drifted back to 6.89 of ln(1024) = 6.93 within 4 epochs;
  with 256 it stayed at 5.31 of 5.55.
- m = 0.996 keeps the teacher ~55% at its random start after 150 steps (EMA time constant 250 steps, a
  sliver of DINO's 125k-step runs but the whole of a short one); 0.99 (dino#246 found the same) lets it learn.
- The head's 2048-wide hidden layers ran on every crop and cost more than the pico encoder itself.
Under torchrun on CPU each process normalises with its own batch's statistics (SyncBatchNorm needs a GPU);
on CUDA the heads are converted to SyncBatchNorm, as DINO does.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...data.multicrop import MultiCrop
from ...errors import ConfigError
from ...layers.dino_head import DinoHead
from ...models import require
from ...typed_config import JsonConfig
from .base import Task


@dataclass
class DinoOptions(JsonConfig):
    _what = "DINO option"

    out_dim: int = 256  # K prototypes (DINO: 65536 on ImageNet; see "Small data" in the module docstring)
    hidden_dim: int = 256  # DINO: 2048
    bottleneck_dim: int = 64  # DINO: 256
    nlayers: int = 3
    use_bn: bool = True  # DINO: False for a ViT, True for a ResNet
    norm_last_layer: bool = True
    momentum_teacher: float = 0.99  # DINO: 0.996 over ~100k steps
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 0
    student_temp: float = 0.1
    center_momentum: float = 0.9
    freeze_last_layer: int = 1  # epochs
    n_local: int = 6  # local crops (DINO: 8)
    local_size: int = 0  # px; 0: 96/224 of the input size, rounded to a multiple of the patch size
    global_scale: tuple = (0.7, 1.0)
    local_scale: tuple = (0.2, 0.5)
    photometric: bool = True  # colour jitter, grayscale, solarisation (data.multicrop)
    eval_knn: bool = True  # leave-one-out k-NN of the frozen features in each evaluation

    def __post_init__(self):
        self.global_scale, self.local_scale = _pair(self.global_scale, "global_scale"), _pair(self.local_scale, "local_scale")
        if self.out_dim < 1 or self.bottleneck_dim < 1 or self.hidden_dim < 1 or self.nlayers < 1:
            raise ConfigError("task.out_dim, task.hidden_dim, task.bottleneck_dim and task.nlayers must be positive")
        if not 0 <= self.momentum_teacher <= 1 or not 0 <= self.center_momentum <= 1:
            raise ConfigError("task.momentum_teacher and task.center_momentum must be in [0, 1]")
        if min(self.teacher_temp, self.warmup_teacher_temp, self.student_temp) <= 0:
            raise ConfigError("the temperatures must be positive")
        if self.n_local < 0 or self.local_size < 0 or self.warmup_teacher_temp_epochs < 0 or self.freeze_last_layer < 0:
            raise ConfigError("task.n_local, task.local_size, task.warmup_teacher_temp_epochs and "
                              "task.freeze_last_layer must not be negative")


def _pair(v, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in v)
    except (TypeError, ValueError):
        raise ConfigError(f"task.{name} must be two numbers, e.g. --set task.{name}=[0.4,1.0]; got {v!r}") from None
    if not 0 < lo <= hi <= 1:
        raise ConfigError(f"task.{name} must satisfy 0 < low <= high <= 1, got {v!r}")
    return lo, hi


def cosine_momentum(step: int, total_steps: int, base: float = 0.996, final: float = 1.0) -> float:
    """DINO's `cosine_scheduler(base, final, epochs, niter_per_ep)[step]` (no warm-up) at iteration `step`
    (0-based): final + (base - final) (1 + cos(pi step / total)) / 2."""
    return final + 0.5 * (base - final) * (1 + math.cos(math.pi * step / total_steps))


def teacher_temperature(epoch: int, teacher_temp: float, warmup_temp: float, warmup_epochs: int) -> float:
    """DINO's `np.linspace(warmup_temp, teacher_temp, warmup_epochs)` for the first epochs, then teacher_temp."""
    if epoch >= warmup_epochs:
        return teacher_temp
    if warmup_epochs == 1:
        return warmup_temp
    return warmup_temp + (teacher_temp - warmup_temp) * epoch / (warmup_epochs - 1)


class DinoLoss(nn.Module):
    """DINOLoss with its centre (a buffer [1, out_dim]); see the module docstring."""

    def __init__(self, out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9):
        super().__init__()
        self.student_temp, self.center_momentum = student_temp, center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(self, student: torch.Tensor, teacher: torch.Tensor, n_crops: int, teacher_temp: float,
                update_center: bool = True) -> torch.Tensor:
        """student [n_crops * B, K] (crops in order: global 1, global 2, locals), teacher [2 * B, K]."""
        student_lp = F.log_softmax(student.float() / self.student_temp, dim=-1).chunk(n_crops)
        teacher_p = F.softmax((teacher.float() - self.center) / teacher_temp, dim=-1).detach().chunk(2)
        total, terms = student.new_zeros((), dtype=torch.float32), 0
        for iq, q in enumerate(teacher_p):
            for v, lp in enumerate(student_lp):
                if v == iq:  # the same view
                    continue
                total = total + torch.sum(-q * lp, dim=-1).mean()
                terms += 1
        if update_center:
            self.update_center(teacher)
        return total / terms

    @torch.no_grad()
    def update_center(self, teacher: torch.Tensor) -> None:
        batch_sum = teacher.float().sum(dim=0, keepdim=True)
        count = torch.tensor(float(len(teacher)), device=teacher.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(batch_sum)
            dist.all_reduce(count)  # = len * world: ranks hold equal micro-batches
        self.center.mul_(self.center_momentum).add_(batch_sum / count, alpha=1 - self.center_momentum)


class DinoTask(Task):
    """`--set task=dino [--set task.out_dim=1024 --set task.n_local=6 --set task.teacher_temp=0.04 ...]` on a
    ViT. The teacher's momentum schedule spans the run: the loop passes its number of optimiser steps to
    `on_train_start` (call it yourself when driving the task by hand)."""

    every_parameter_used = False  # the model's classifier gets no gradient

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        require(self.model, "token_seam", "DINO")
        require(self.model, "pos_resample", "DINO's local crops")
        self.opts = o = DinoOptions.from_dict(recipe.task_args)
        m = self.model
        dim = m.num_features
        self._ddp = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        head = DinoHead(dim, o.out_dim, hidden_dim=o.hidden_dim, bottleneck_dim=o.bottleneck_dim, nlayers=o.nlayers,
                        use_bn=o.use_bn, norm_last_layer=o.norm_last_layer).to(self.device)
        if self._ddp and self.device.type == "cuda":  # batch statistics over all processes, as DINO
            head = nn.SyncBatchNorm.convert_sync_batchnorm(head)
        self.student_head = head
        # the EMA teacher: held outside the trained module (never trained by gradients, never DDP-wrapped)
        self.hold("teacher", copy.deepcopy(m).eval().requires_grad_(False))
        # the teacher head follows the task's mode (`train`), as DINO's teacher: while training, a BatchNorm in
        # it normalises with the batch's statistics (its running statistics are never trained: buffers are not
        # averaged); an evaluation uses them and leaves them as they were
        self.hold("teacher_head", copy.deepcopy(self.student_head).requires_grad_(False))
        self.loss_fn = DinoLoss(o.out_dim, o.student_temp, o.center_momentum).to(self.device)
        gh, gw = (int(s) for s in m.preprocess.input_size[1:])
        ph, pw = m.patch_embed.patch_size
        if o.local_size:
            lh = lw = o.local_size
            if lh % ph or lw % pw:
                raise ConfigError(f"task.local_size {o.local_size} must be a multiple of the patch size {ph}")
        else:
            lh, lw = (max(p, round(g * 96 / 224 / p) * p) for g, p in ((gh, ph), (gw, pw)))
        pre = m.preprocess
        self.crops = MultiCrop((gh, gw), (lh, lw), o.n_local, o.global_scale, o.local_scale,
                               tuple(pre.mean), tuple(pre.std), photometric=o.photometric)
        self.n_crops = 2 + o.n_local
        self.epoch, self.step, self._micro = 0, 0, 0
        self.total_steps: int | None = None
        self.teacher_temp = teacher_temperature(0, o.teacher_temp, o.warmup_teacher_temp, o.warmup_teacher_temp_epochs)
        self.momentum = o.momentum_teacher
        self._freeze = False
        for p in self.student_head.last_layer.parameters():
            if p.requires_grad:
                p.register_hook(lambda g: torch.zeros_like(g) if self._freeze else g)

    def train(self, mode: bool = True) -> DinoTask:
        super().train(mode)
        self.teacher_head.train(mode)
        return self

    # -- schedules
    def on_epoch_start(self, epoch: int) -> None:
        o = self.opts
        self.epoch = epoch
        self.teacher_temp = teacher_temperature(epoch, o.teacher_temp, o.warmup_teacher_temp,
                                                o.warmup_teacher_temp_epochs)
        self._freeze = epoch < o.freeze_last_layer

    def on_train_start(self, total_steps: int, steps_per_epoch: int) -> None:
        self.total_steps = total_steps

    def after_step(self, step: int) -> None:
        """The EMA update after optimiser step `step` (1-based: DINO's iteration step - 1)."""
        if self.total_steps is None:
            raise ConfigError("DinoTask needs the run's number of optimiser steps: call on_train_start first")
        self.step, self._micro = step, 0
        self.momentum = m = cosine_momentum(step - 1, self.total_steps, self.opts.momentum_teacher, 1.0)
        with torch.no_grad():
            t = [*self.teacher.parameters(), *self.teacher_head.parameters()]
            s = [*self.model.parameters(), *self.student_head.parameters()]
            torch._foreach_mul_(t, m)
            torch._foreach_add_(t, [p.detach() for p in s], alpha=1 - m)

    # -- the objective
    @staticmethod
    def _features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model.forward_head(model(x, features=True), pre_logits=True)  # through __call__: compiled if asked

    def outputs(self, x: torch.Tensor, generator: torch.Generator | None = None, model: nn.Module | None = None,
                world: tuple[int, int] = (1, 0)) -> tuple[torch.Tensor, torch.Tensor]:
        """(student outputs [n_crops * B, K], teacher outputs [2 * B, K]) for images [B, C, H, W] with `model`
        (default the trained one) as the student's encoder; `world`: (processes, rank) sharing the batch
        equally (the crops are drawn for the whole batch)."""
        model = model or self.model
        globals_, locals_ = self.crops(x, generator, total=len(x) * world[0], offset=len(x) * world[1])
        g = torch.cat(globals_)
        with self.autocast():
            feats = [self._features(model, g)]
            if locals_:
                feats.append(self._features(model, torch.cat(locals_)))
            student = self.student_head(torch.cat(feats))
        with torch.no_grad(), self.autocast():
            teacher = self.teacher_head(self._features(self.teacher, g))
        return student.float(), teacher.float()

    def forward(self, batch) -> dict[str, Any]:
        from ...data.datasets import sample_seed

        x = batch[0]
        # the crops of optimiser step `step`, micro-batch `_micro`, drawn for the global micro-batch (the loop
        # gives each process an equal slice of it, in rank order): a run on N processes crops as one does
        gen = torch.Generator().manual_seed(sample_seed(self.recipe.seed, self.step, 3_000_000 + self._micro))
        self._micro += 1
        world = (dist.get_world_size(), dist.get_rank()) if self._ddp else (1, 0)
        student, teacher = self.outputs(x, gen, world=world)
        loss = self.loss_fn(student, teacher, self.n_crops, self.teacher_temp)
        return {"loss": loss, "batch_size": len(x)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        from ...probe import knn_scores

        gen = torch.Generator().manual_seed(0)  # the same crops every epoch
        total, n = 0.0, 0
        feats, tfeats, labels = [], [], []
        for batch in loader:
            x = batch[0].to(self.device)
            student, teacher = self.outputs(x, gen, model)
            total += self.loss_fn(student, teacher, self.n_crops, self.teacher_temp, update_center=False).item() * len(x)
            n += len(x)
            if self.opts.eval_knn and len(batch) > 1:
                with self.autocast():
                    feats.append(self._features(model, x).float().cpu())
                    tfeats.append(self._features(self.teacher, x).float().cpu())
                labels.append(torch.as_tensor(batch[1]).long().cpu())
        loss = total / max(n, 1)
        out: dict[str, Any] = {"loss": loss, "score": -loss}
        if labels and len(torch.cat(labels)) > 1 and self.num_classes > 1:
            y = torch.cat(labels)
            for name, f in (("knn_top1", feats), ("teacher_knn_top1", tfeats)):
                scores = knn_scores(torch.cat(f), y, torch.cat(f), num_classes=self.num_classes, exclude_self=True)
                out[name] = 100.0 * (scores.argmax(1) == y).float().mean().item()
            out["score"] = out["knn_top1"]
        return out

    # -- what the loop keeps
    def held_state(self) -> dict[str, nn.Module]:
        return {"teacher": self.teacher, "teacher_head": self.teacher_head}

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        return {"step": torch.tensor(self.step)}  # the crops' seed

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.step, self._micro = int(state["step"]), 0

    def checkpoints(self, provenance: dict[str, Any]) -> dict[str, tuple[nn.Module, dict[str, Any]]]:
        """teacher.safetensors: the EMA teacher's encoder (DINO evaluates and releases the teacher), a normal
        checkpoint for `--finetune` or `vitkit eval --protocol knn`; its `accuracy` is the teacher's k-NN."""
        acc = {k.replace("teacher_", ""): v for k, v in (provenance.get("accuracy") or {}).items() if "teacher_" in k}
        return {"teacher.safetensors": (self.teacher, dict(provenance) | {
            "accuracy": acc, "dino_role": "teacher", "step": self.step, "teacher_momentum": round(self.momentum, 6),
            "dino_note": "the EMA teacher's encoder of a DINO run (the student is last.safetensors); no DINO head"})}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        text = f"dino loss {metrics['loss']:.4f}"
        if "knn_top1" in metrics:
            text += f" k-NN top-1 {metrics['knn_top1']:.2f}% (teacher {metrics['teacher_knn_top1']:.2f}%)"
        return text + (f" (without EMA: score {raw['score']:.4g})" if raw else "")
