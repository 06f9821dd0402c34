"""Whole models around an image model (MAE's encoder + decoder, DINO's backbone + head, CLIP's image tower +
text tower): as VitkitModels they are their image tower, so predict, embed, eval, the necks and fine-tuning work on
them unchanged, and what they add (the decoder, the projection head, the text side) answers to their own forward
arguments or methods. Their configs share `TowerConfig`, their models `ImageTowerModel`.

A family's model names its image tower in `towers` (name -> (attribute, config field)): `load_model(path,
tower="image")` and `create_model(<a name of the tower's family>, checkpoint_path=<whole file>)` take that
part of a whole checkpoint (api.Checkpoint.tower).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .config import ModelConfig, ViTConfig


def prefixed_matcher(matcher: dict, prefix: str) -> dict:
    """A timm-style group matcher for parameters named `prefix` + name: every `^` anchor moves past the prefix."""
    anchor = "^" + re.escape(prefix)

    def shift(rx: str) -> str:
        return rx.replace("^", anchor)

    out = dict(matcher)
    if "stem" in out:
        out["stem"] = shift(out["stem"])
    if "blocks" in out:
        blocks = out["blocks"]
        out["blocks"] = shift(blocks) if isinstance(blocks, str) else [(shift(rx), suffix) for rx, suffix in blocks]
    return out


class TowerConfig(ModelConfig):
    """The config part every whole model around an image tower shares: its field `tower_field` holds the tower's
    ViTConfig, whose size, channels and classes are the whole model's (what every family's config has), and
    `replace` sends ViT field names to it. A family with a classifier of its own on the tower's output (CLIP's,
    on the image embedding) declares `num_classes` as a field, which stands in front of the tower's."""

    tower_field = "encoder"

    def __post_init__(self):
        """The tower as a ViTConfig: a saved file's dict is read into one, anything else refused."""
        tower = self.tower_config
        if isinstance(tower, dict):
            tower = ViTConfig.from_dict(tower)
            setattr(self, self.tower_field, tower)
        if not isinstance(tower, ViTConfig):
            raise ConfigError(f"{self._what}: its {self.tower_field} must be a ViT config, got {type(tower).__name__}")

    @property
    def tower_config(self) -> ViTConfig:
        return getattr(self, self.tower_field)

    @property
    def img_size(self) -> tuple[int, int]:
        return self.tower_config.img_size

    @property
    def in_chans(self) -> int:
        return self.tower_config.in_chans

    @property
    def num_classes(self) -> int:
        return self.tower_config.num_classes

    def replace(self, **overrides: Any):
        """Own fields by name; ViT field names (img_size, num_classes, depth, ...) to the tower's config."""
        own = {f.name for f in dataclasses.fields(self)}
        vit_fields = {f.name for f in dataclasses.fields(ViTConfig)}
        unknown = sorted(set(overrides) - own - vit_fields)
        if unknown:
            raise ConfigError(f"unknown model option(s) {unknown} for a {self._what}; valid options: "
                              f"{', '.join(sorted(own))} and the image tower's ({', '.join(sorted(vit_fields))})")
        mine = {k: v for k, v in overrides.items() if k in own}
        tower = mine.pop(self.tower_field, self.tower_config)
        if isinstance(tower, dict):
            tower = ViTConfig.from_dict(tower)
        to_tower = {k: v for k, v in overrides.items() if k not in own}
        if to_tower:
            tower = tower.replace(**to_tower)
        return dataclasses.replace(self, **{self.tower_field: tower}, **mine)  # __post_init__ validates the result


class ImageTowerModel(nn.Module):
    """The model protocol (models/protocol.py) answered by the image model in `self.<image_attr>`; subclasses
    set `image_attr`, build that model, and add their own parts."""

    image_attr = "encoder"

    @property
    def image_model(self) -> nn.Module:
        return getattr(self, self.image_attr)

    # ------------------------------------------------------------------ the image side
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.image_model.forward_features(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.image_model.forward_head(x, pre_logits=pre_logits)

    @property
    def output_fmts(self) -> tuple[str, ...]:
        return self.image_model.output_fmts

    @property
    def feature_info(self) -> list[dict]:
        """The image model's maps, their modules named from this model."""
        return [e | {"module": f"{self.image_attr}.{e['module']}"} for e in self.image_model.feature_info]

    def forward_intermediates(self, x: torch.Tensor, indices=None, **kwargs):
        return self.image_model.forward_intermediates(x, indices, **kwargs)

    # ------------------------------------------------------------------ heads and training
    def get_classifier(self) -> nn.Module:
        return self.image_model.get_classifier()

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.image_model.reset_classifier(num_classes, global_pool)
        self._classes_changed(num_classes)

    def _classes_changed(self, num_classes: int) -> None:
        """Record a new class count in the model and its config; class names that no longer fit are dropped."""
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        if self.class_names is not None and len(self.class_names) != num_classes:
            self.class_names = None

    def no_weight_decay(self) -> set[str]:
        return {f"{self.image_attr}.{n}" for n in self.image_model.no_weight_decay()}

    def group_matcher(self, coarse: bool = False) -> dict:
        """The image model's groups; the parts this model adds are unmatched, so in the last group."""
        return prefixed_matcher(self.image_model.group_matcher(coarse), f"{self.image_attr}.")

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.image_model.set_grad_checkpointing(enable)

    def adapt_checkpoint(self, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> dict[str, torch.Tensor]:
        """The image model's adaptations (position table to this grid, 1/3-channel patch filters) on its part."""
        prefix = f"{self.image_attr}."
        inner = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        if hasattr(self.image_model, "adapt_checkpoint"):
            inner = self.image_model.adapt_checkpoint(inner, source)
        return {k: v for k, v in sd.items() if not k.startswith(prefix)} | {prefix + k: v for k, v in inner.items()}
