"""The model a training run starts from, for any registered family: by name from scratch, or any checkpoint
vitkit can load, with a new head, resolution or channel count."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from ..api import checkpoint_family, create_model, load_model, read_checkpoint, save_model
from ..models import get_entry, get_family


def build(recipe, num_classes: int, data_channels: int, data_size: tuple[int, int] | None,
          finetune: str | os.PathLike | None = None) -> nn.Module:
    """The model a recipe asks for: from scratch by name, or a checkpoint with a new head/resolution.

    From scratch, a family whose model runs at any input size (`fits_data`, e.g. a ResNet) is built at
    the data's size and channel count; a ViT keeps its registered size and channels (the data is
    converted) unless the recipe sets `img_size` / `in_chans`."""
    arch = dict(recipe.model_args)
    if recipe.in_chans is not None:
        arch["in_chans"] = recipe.in_chans
    if finetune is not None:
        # a whole model (a CLIP pair, an MAE with its decoder, DINO with its head) fine-tunes its image tower
        if recipe.drop_path_rate is not None and hasattr(get_family(image_tower_family(finetune)).config,
                                                          "drop_path_rate"):
            arch["drop_path_rate"] = recipe.drop_path_rate
        model = load_any(finetune, tower="image", num_classes=num_classes, img_size=recipe.img_size, **arch)
        model.provenance = {"arch": model.provenance.get("arch"), "finetuned_from": str(finetune)}
        return model
    family = get_family(get_entry(recipe.model).family)
    if recipe.drop_path_rate is not None and hasattr(family.config, "drop_path_rate"):
        arch["drop_path_rate"] = recipe.drop_path_rate
    size = recipe.img_size
    if getattr(family.model, "fits_data", False):
        arch.setdefault("in_chans", data_channels)
        size = size or data_size
    return create_model(recipe.model, num_classes=num_classes, img_size=size, **arch)


def image_tower_family(path: str | os.PathLike) -> str:
    """The family of the model a fine-tuning run trains from `path`: the file's own, or its image tower's."""
    family = checkpoint_family(path)
    if "image" not in getattr(get_family(family).model, "towers", {}):
        return family
    return read_checkpoint(path).tower("image").family


def load_any(path: str | os.PathLike, **kw: Any) -> nn.Module:
    """`vitkit.load_model` with the options that are set (None means: as the checkpoint has it)."""
    return load_model(path, **{k: v for k, v in kw.items() if v is not None})


def save(model: nn.Module, path: str | os.PathLike, class_names=None, provenance=None) -> Path:
    return save_model(model, path, class_names=class_names, provenance=provenance)


def in_chans(model) -> int:
    """The channel count a model (or an ONNX runner) expects."""
    return int(model.preprocess.input_size[0])
