"""DeiT distillation (Touvron et al. 2021): the student's distillation token learns from a frozen teacher of
any family while its class token learns from the labels; at evaluation the two heads are averaged.

The loss is (1 - alpha) * CE(class head, labels) + alpha * KD(distillation head, teacher), where KD is
- hard: CE(distillation head, teacher's argmax);
- soft: KL(softmax(student / tau) || softmax(teacher / tau)) * tau^2, summed and divided by the number of
  logits B*K as in facebookresearch/deit's DistillationLoss (`kl="deit"`), or by the batch size B as in timm's
  TokenDistillationTask (`kl="timm"`, reduction "batchmean"); the two differ by a factor K.
The teacher sees the same (mixed) batch, re-normalised to its own preprocessing when that differs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ...typed_config import JsonConfig
from .classification import ClassificationTask

KINDS, KL_NORMS = ("hard", "soft"), ("deit", "timm")


@dataclass
class DistillationOptions(JsonConfig):
    _what = "distillation option"

    teacher: str = ""  # any checkpoint vitkit loads: a run's best.safetensors, a timm file, a pretrained name
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


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str = "hard", tau: float = 1.0,
                      kl: str = "deit") -> torch.Tensor:
    """The KD term for student logits [B, K] and teacher logits [B, K] (see the module docstring)."""
    student, teacher = student.float(), teacher.float()
    if kind == "hard":
        return F.cross_entropy(student, teacher.argmax(dim=1))
    s, t = F.log_softmax(student / tau, dim=1), F.log_softmax(teacher / tau, dim=1)
    summed = F.kl_div(s, t, reduction="sum", log_target=True) * (tau * tau)
    return summed / (student.numel() if kl == "deit" else student.shape[0])


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
    """`--set task=distillation --set task.teacher=CKPT [--set task.kind=soft --set task.tau=3 ...]` on a
    student with a distillation token (a deit_*_distilled_* model, or --set model.distilled=true)."""

    def __init__(self, recipe, **kw):
        super().__init__(recipe, **kw)
        from ...api import load_model

        self.opts = DistillationOptions.from_dict(recipe.task_args)
        if not self.opts.teacher:
            raise ConfigError("distillation needs a teacher: --set task.teacher=CKPT (e.g. a ResNet run's "
                              "best.safetensors)")
        if not getattr(self.model.cfg, "distilled", False):
            raise ConfigError("the student needs a distillation token: a deit_*_distilled_* model or "
                              "--set model.distilled=true")
        self.model.set_distilled_training(True)  # train mode returns (class logits, distillation logits)
        self.teacher = load_model(self.opts.teacher).to(self.device).eval().requires_grad_(False)
        if self.teacher.num_classes != self.num_classes:
            raise ConfigError(f"the teacher {self.opts.teacher} has {self.teacher.num_classes} classes, the data "
                              f"{self.num_classes}")
        self.teacher_input = TeacherInput(self.model.preprocess, self.teacher.preprocess).to(self.device)

    def __call__(self, batch) -> dict[str, Any]:
        x, y = batch
        if self.mixing:
            x, y = self.mixer(x, y)  # the teacher sees the same mixed images
        with self.autocast():
            cls_logits, dist_logits = self.net(x)
        with torch.no_grad(), self.autocast():
            teacher_logits = self.teacher(self.teacher_input(x)).float()
        base = self.loss(cls_logits, y)
        kd = distillation_loss(dist_logits, teacher_logits, self.opts.kind, self.opts.tau, self.opts.kl)
        a = self.opts.alpha
        return {"loss": (1 - a) * base + a * kd, "base_loss": base.detach(), "kd_loss": kd.detach(),
                "logits": (cls_logits + dist_logits) / 2, "target": y, "batch_size": len(x)}
