"""torchvision ResNet baselines with a stem for small images (3x3 stride-1 conv, no max-pool), so a user
can compare a CNN and a ViT on the same data, pipeline and budget.

Saved as vitkit safetensors too: config {"arch": "resnet18", ...} in the same metadata fields.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError
from .config import Preprocess

RESNETS = ("resnet18", "resnet34", "resnet50")


def is_resnet(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in RESNETS


def create_resnet(name: str, num_classes: int = 10, in_chans: int = 1, img_size: int | tuple = 28,
                  small_stem: bool = True, mean=(0.5,), std=(0.5,)) -> nn.Module:
    import torchvision

    if name not in RESNETS:
        raise ConfigError(f"unknown ResNet {name!r}; known: {', '.join(RESNETS)}")
    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if small_stem:  # 28x28 or 32x32 inputs: keep resolution in the stem (the CIFAR ResNet stem)
        model.conv1 = nn.Conv2d(in_chans, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_chans != 3:
        model.conv1 = nn.Conv2d(in_chans, 64, kernel_size=7, stride=2, padding=3, bias=False)
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    if len(mean) != in_chans:
        mean, std = (sum(mean) / len(mean),) * in_chans, (sum(std) / len(std),) * in_chans
    model.arch_config = {"arch": name, "num_classes": num_classes, "in_chans": in_chans, "img_size": list(size),
                         "small_stem": small_stem}
    model.num_classes = num_classes
    model.preprocess = Preprocess(tuple(mean), tuple(std), "bilinear", 1.0, (in_chans, *size))
    model.class_names = None
    model.provenance = {"arch": name}
    model.no_weight_decay = lambda: set()
    return model


def save_resnet(model: nn.Module, path: str | os.PathLike, class_names: list[str] | None = None,
                provenance: dict[str, Any] | None = None) -> Path:
    from ..weights.io import save_checkpoint

    names = class_names if class_names is not None else model.class_names
    prov = dict(model.provenance) | dict(provenance or {})
    prov.setdefault("params", sum(p.numel() for p in model.parameters()))
    return save_checkpoint(path, model.state_dict(), model.arch_config, model.preprocess.to_dict(), names, prov)


def load_resnet(sd: dict[str, torch.Tensor], vk: dict[str, Any], path: str | os.PathLike) -> nn.Module:
    cfg = dict(vk["config"])
    pre = Preprocess.from_dict(vk["preprocess"] or {})
    model = create_resnet(cfg["arch"], cfg["num_classes"], cfg["in_chans"], tuple(cfg["img_size"]),
                          cfg.get("small_stem", True), pre.mean, pre.std)
    try:
        model.load_state_dict(sd)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit {cfg['arch']}: {str(e).splitlines()[0]}") from None
    model.class_names = vk.get("class_names") or None
    model.provenance = vk.get("provenance") or {}
    return model
