"""Building, saving and loading the models the trainer handles: vitkit ViTs and the ResNet baselines."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from ..models.config import Preprocess
from ..models.resnet import create_resnet, is_resnet, load_resnet, save_resnet


def build(recipe, num_classes: int, data_channels: int, data_size: tuple[int, int] | None,
          finetune: str | os.PathLike | None = None) -> nn.Module:
    """The model a recipe asks for: from scratch by name, or a checkpoint with a new head/resolution."""
    import vitkit

    arch = dict(recipe.model_args)
    if recipe.drop_path_rate is not None and not is_resnet(recipe.model):
        arch["drop_path_rate"] = recipe.drop_path_rate
    if recipe.in_chans is not None:
        arch["in_chans"] = recipe.in_chans
    if finetune is not None:
        model = load_any(finetune, num_classes=num_classes, img_size=recipe.img_size, **arch)
        model.provenance = {"arch": model.provenance.get("arch"), "finetuned_from": str(finetune)}
    elif is_resnet(recipe.model):
        size = recipe.img_size or (data_size or (32, 32))
        model = create_resnet(recipe.model, num_classes, arch.get("in_chans", data_channels), size,
                              arch.get("small_stem", True))
    else:
        model = vitkit.create_model(recipe.model, num_classes=num_classes, img_size=recipe.img_size, **arch)
    fix_preprocess(model)
    return model


def fix_preprocess(model: nn.Module) -> None:
    """Keep mean/std as long as the model's channel count (after in_chans adaptation)."""
    pre = model.preprocess
    c = pre.input_size[0]
    if len(pre.mean) != c:
        m, s = sum(pre.mean) / len(pre.mean), sum(pre.std) / len(pre.std)
        model.preprocess = Preprocess((m,) * c, (s,) * c, pre.interpolation, pre.crop_pct, pre.input_size)


def load_any(path: str | os.PathLike, **kw: Any) -> nn.Module:
    """vitkit.load_model for ViTs (any importable format), plus the ResNet baselines."""
    import vitkit

    from ..weights.io import parse_vitkit_meta, read_safetensors, read_safetensors_meta, resolve_path

    path = resolve_path(path)
    if path.is_file() and path.suffix == ".safetensors":
        vk = parse_vitkit_meta(read_safetensors_meta(path), path)  # the header only: ViTs are read once, below
        if vk is not None and is_resnet(vk["config"].get("arch")):
            if any(v is not None for v in kw.values()):
                from ..errors import ConfigError

                raise ConfigError(f"{path}: fine-tuning a ResNet checkpoint is not supported")
            return load_resnet(read_safetensors(path)[0], vk, path)
    kw = {k: v for k, v in kw.items() if v is not None}
    model = vitkit.load_model(path, **kw)
    fix_preprocess(model)
    return model


def save(model: nn.Module, path: str | os.PathLike, class_names=None, provenance=None) -> Path:
    import vitkit

    if hasattr(model, "arch_config"):
        return save_resnet(model, path, class_names, provenance)
    return vitkit.save_model(model, path, class_names=class_names, provenance=provenance)


def in_chans(model: nn.Module) -> int:
    return int(model.preprocess.input_size[0])
