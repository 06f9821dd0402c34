"""What an importer is: `@layout(name, detect, family=...)` registers a filter from one foreign checkpoint layout to
a family's key names, returning `Imported`.

This module is what importers import and what weights.convert reads (LAYOUTS); it imports neither, so the
registry has no cycle: weights.convert imports the importers package, which imports each importer, which
imports this.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

StateDict = dict[str, torch.Tensor]

# where a hub repo keeps a family's weights, when a layout does not say otherwise (timm's hub format)
DEFAULT_HUB_FILES = ("model.safetensors",)


@dataclass
class Imported:
    """A state dict in a family's key names, plus what the source told us about the architecture."""

    state_dict: StateDict
    layout: str
    hints: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields known from the source
    dropped: list[str] = field(default_factory=list)  # source keys that have no place in the model
    preprocess: Any = None  # models.config.Preprocess the source states (mean/std/crop), if any
    class_names: list[str] | None = None
    family: str = "vit"  # the model family the weights belong to (set from the layout)
    config: Any = None  # the family's config read off the weights; None for a ViT (weights.infer reads it)


@dataclass
class Layout:
    name: str
    detect: Callable[[StateDict], bool]
    convert: Callable[[StateDict, dict | None], Imported]
    priority: int = 0
    family: str = "vit"
    hub_files: tuple[str, ...] = ()  # the files of a hub repo that hold this layout, first choice first


LAYOUTS: list[Layout] = []


def layout(name: str, detect: Callable[[StateDict], bool], priority: int = 0, family: str = "vit",
           hub_files: tuple[str, ...] = ()):
    """Register `convert(sd, hf_config) -> Imported` for checkpoints whose keys satisfy `detect`; the weights it
    returns belong to `family`. `hub_files`: where a hub repo of that family's published weights keeps this layout
    (open_clip's pair files beside timm's image tower), for `pretrained=True`."""

    def register(fn):
        LAYOUTS.append(Layout(name, detect, fn, priority, family, tuple(hub_files)))
        LAYOUTS.sort(key=lambda lay: -lay.priority)
        return fn

    return register


def hub_files(family: str) -> tuple[str, ...]:
    """The files to fetch from a hub repo of `family`'s published weights, first choice first."""
    return next((lay.hub_files for lay in LAYOUTS if lay.family == family and lay.hub_files), DEFAULT_HUB_FILES)
