"""DeiT distillation (Touvron et al. 2021): the student's distillation token learns from a frozen teacher of
any family while its class token learns from the labels; at evaluation the two heads are averaged.

The loss is (1 - alpha) * CE(class head, labels) + alpha * KD(distillation head, teacher), where KD is
- hard: CE(distillation head, teacher's argmax);
- soft: KL(softmax(student / tau) || softmax(teacher / tau)) * tau^2, summed and divided by the number of
  logits B*K as in facebookresearch/deit's DistillationLoss (`kl="deit"`), or by the batch size B as in timm's
  TokenDistillationTask (`kl="timm"`, reduction "batchmean"); the two differ by a factor K.
The teacher sees the same (mixed) batch, re-normalised to its own preprocessing when that differs.

The teacher is any checkpoint vitkit loads, or `recipe:NAME`: a preset trained first, into its own run folder
(`task.teacher_out`, default runs/NAME), then used from its best.safetensors. A finished run there is reused,
an unfinished one resumed, so `vitkit train --recipe fashion-mnist-deit` trains the ResNet-18 once. That step
runs before the student's Trainer exists (training/pipeline.py); the task itself only loads checkpoints.

Teacher logits cache (`task.cache_teacher`, on by default): when the recipe's augmentation gives each image a
few fixed variants (no random crop, RandAugment, erasing or mixing; a flip at most), the teacher's logits of
each variant are kept, keyed by a hash of the image's bytes, and reused in later epochs. A ResNet-18 teacher's
forward at 28x28 costs ~4x the small ViT student's training step per image (measured), so from the second
epoch on most of a distillation step's cost goes. The cache is kept in state.safetensors: --resume continues
exactly. It stops growing at `task.cache_mb`. One process only: under torchrun each process would keep
its own images' logits and only rank 0's would be saved.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ...typed_config import JsonConfig
from .classification import ClassificationTask

KINDS, KL_NORMS = ("hard", "soft"), ("deit", "timm")


@dataclass
class DistillationOptions(JsonConfig):
    _what = "distillation option"

    teacher: str = ""  # any checkpoint vitkit loads (a run's best.safetensors, a timm file, a pretrained name),
    # or recipe:NAME (a preset, trained first; see the module docstring)
    teacher_out: str = ""  # recipe:NAME's run folder; default runs/NAME
    teacher_set: tuple = ()  # recipe:NAME's overrides, as --set takes them: ["epochs=1", "train_subset=2000"]
    cache_teacher: bool = True  # keep the teacher's logits per image variant (see the module docstring)
    cache_mb: float = 512.0  # the cache's size limit (logits and keys)
    kind: str = "hard"  # hard | soft
    alpha: float = 0.5  # weight of the distillation term
    tau: float = 1.0  # soft: temperature
    kl: str = "deit"  # soft: normalise the summed KL by B*K (deit) or by B (timm)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"task.kind must be one of {KINDS}, got {self.kind!r}")
        if self.kl not in KL_NORMS:
            raise ConfigError(f"task.kl must be one of {KL_NORMS}, got {self.kl!r}")
        if not 0 <= self.alpha <= 1 or self.tau <= 0:
            raise ConfigError("task.alpha must be in [0, 1] and task.tau positive")
        if not all(isinstance(a, str) for a in self.teacher_set):
            raise ConfigError(f"task.teacher_set must be a list of key=value strings, got {list(self.teacher_set)!r}")


TEACHER_RECIPE = "recipe:"


def teacher_run(opts: DistillationOptions) -> tuple[str, str, tuple] | None:
    """For a teacher given as recipe:NAME: (NAME, its run folder, its overrides), which training/pipeline.py
    trains (or finds finished) before the student's Trainer exists; None for a checkpoint."""
    if not opts.teacher.startswith(TEACHER_RECIPE):
        return None
    name = opts.teacher[len(TEACHER_RECIPE):]
    return name, opts.teacher_out or f"runs/{name}", tuple(opts.teacher_set)


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str = "hard", tau: float = 1.0,
                      kl: str = "deit") -> torch.Tensor:
    """The KD term for student logits [B, K] and teacher logits [B, K] (see the module docstring)."""
    student, teacher = student.float(), teacher.float()
    if kind == "hard":
        return F.cross_entropy(student, teacher.argmax(dim=1))
    s, t = F.log_softmax(student / tau, dim=1), F.log_softmax(teacher / tau, dim=1)
    summed = F.kl_div(s, t, reduction="sum", log_target=True) * (tau * tau)
    return summed / (student.numel() if kl == "deit" else student.shape[0])


def fixed_variants(recipe) -> bool:
    """The train transform gives each image a few fixed variants: no random crop, RandAugment, erasing or
    mixing (a flip at most), so the teacher's logits of an image can be reused."""
    return (recipe.crop == "none" and not recipe.auto_augment and not recipe.reprob and not recipe.mixup
            and not recipe.cutmix)


def image_keys(x: torch.Tensor) -> list[int]:
    """One 63-bit key per image of x [B, ...], from its bytes (blake2b: the same in every process)."""
    rows = x.detach().float().cpu().contiguous().numpy()
    return [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little") >> 1 for r in rows]


class TeacherInput(nn.Module):
    """Images normalised for the student -> the same images as the teacher's preprocessing wants them
    (un-normalise, match channels and size, normalise with the teacher's mean/std); identity if equal."""

    def __init__(self, student_pre, teacher_pre):
        super().__init__()
        self.same = (tuple(student_pre.mean), tuple(student_pre.std), tuple(student_pre.input_size)) == \
            (tuple(teacher_pre.mean), tuple(teacher_pre.std), tuple(teacher_pre.input_size))
        self.register_buffer("s_mean", torch.tensor(student_pre.mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("s_std", torch.tensor(student_pre.std).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("t_mean", torch.tensor(teacher_pre.mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("t_std", torch.tensor(teacher_pre.std).view(1, -1, 1, 1), persistent=False)
        self.size = tuple(teacher_pre.input_size[1:])
        self.channels = int(teacher_pre.input_size[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.same:
            return x
        x = x * self.s_std + self.s_mean  # pixels in [0, 1]
        if x.shape[1] != self.channels:
            x = x.mean(dim=1, keepdim=True) if self.channels == 1 else x.expand(-1, self.channels, -1, -1)
        if tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=True)
        return (x - self.t_mean) / self.t_std


class DistillationTask(ClassificationTask):
    """`--set task=distillation --set task.teacher=CKPT|recipe:NAME [--set task.kind=soft --set task.tau=3 ...]`
    on a student with a distillation token (a deit_*_distilled_* model, or --set model.distilled=true)."""

    padded_batches = False  # the teacher (any family) takes square images

    @classmethod
    def runs_first(cls, recipe) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        run = teacher_run(DistillationOptions.from_dict(recipe.task_args))
        return {"teacher": run} if run else {}

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        from ...api import load_model

        self.opts = DistillationOptions.from_dict(recipe.task_args)
        if not self.opts.teacher:
            raise ConfigError("distillation needs a teacher: --set task.teacher=CKPT (e.g. a ResNet run's "
                              "best.safetensors)")
        if not getattr(self.model.cfg, "distilled", False):
            raise ConfigError("the student needs a distillation token: a deit_*_distilled_* model or "
                              "--set model.distilled=true")
        if teacher_run(self.opts):
            raise ConfigError(f"the teacher {self.opts.teacher} is a recipe: train through vitkit.training.pipeline"
                              ".train (as `vitkit train` does), which trains or finds it first")
        self.model.set_distilled_training(True)  # train mode returns (class logits, distillation logits)
        self.teacher_path = self.opts.teacher
        self.hold("teacher", load_model(self.teacher_path).to(self.device).eval().requires_grad_(False))
        if self.teacher.num_classes != self.num_classes:
            raise ConfigError(f"the teacher {self.teacher_path} has {self.teacher.num_classes} classes, the data "
                              f"{self.num_classes}")
        self.teacher_input = TeacherInput(self.model.preprocess, self.teacher.preprocess).to(self.device)
        one_process = not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
        use_cache = self.opts.cache_teacher and fixed_variants(recipe) and one_process
        self.cache: dict[int, torch.Tensor] | None = {} if use_cache else None
        self.cache_limit = int(self.opts.cache_mb * 2**20 / (4 * self.num_classes + 8))  # entries

    @torch.no_grad()
    def teacher_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The teacher's logits [B, K] (float32) of images x (normalised for the student), from the cache
        where it has them; the others are computed as one sub-batch and added to it."""
        if self.cache is None:
            with self.autocast():
                return self.teacher(self.teacher_input(x)).float()
        keys = image_keys(x)
        todo = [i for i, k in enumerate(keys) if k not in self.cache]
        if todo:
            with self.autocast():
                fresh = self.teacher(self.teacher_input(x[todo])).float().cpu()
            for i, row in zip(todo, fresh):
                if len(self.cache) < self.cache_limit:
                    self.cache[keys[i]] = row
                else:
                    break
            new = dict(zip(todo, fresh))
        else:
            new = {}
        return torch.stack([new[i] if i in new else self.cache[k] for i, k in enumerate(keys)]).to(self.device)

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        """The teacher logits cache (kept for --resume)."""
        if not self.cache:
            return {}
        return {"teacher_cache_keys": torch.tensor(list(self.cache), dtype=torch.int64),
                "teacher_cache_logits": torch.stack(list(self.cache.values()))}

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.cache is not None and state:
            self.cache = dict(zip(state["teacher_cache_keys"].tolist(), state["teacher_cache_logits"].unbind(0)))

    def forward(self, batch) -> dict[str, Any]:
        x, y = batch
        if self.mixing:
            x, y = self.mixer(x, y)  # the teacher sees the same mixed images
        with self.autocast():
            cls_logits, dist_logits = self.model(x)
        teacher_logits = self.teacher_logits(x)
        base = self.loss(cls_logits, y)
        kd = distillation_loss(dist_logits, teacher_logits, self.opts.kind, self.opts.tau, self.opts.kl)
        a = self.opts.alpha
        return {"loss": (1 - a) * base + a * kd, "base_loss": base.detach(), "kd_loss": kd.detach(),
                "logits": (cls_logits + dist_logits) / 2, "target": y, "batch_size": len(x)}
