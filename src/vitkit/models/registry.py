"""The model registry: every name belongs to a family, and a family knows its config type and model class.

A family is a model class plus its typed config (`vit`: VisionTransformer + ViTConfig; `resnet`: ResNet +
ResNetConfig). A registered name is a family, a default config and the preprocessing and pretrained weights
that go with it, so `entry.build(**overrides)` is the whole recipe for a model. A new family is one new
module that calls `register_family` and `register_model` (see models/resnet.py); nothing shared changes. Its
model keeps the protocol (models/protocol.py), the feature contract included (models/features.py), which
tests/test_feature_contract.py checks for every family registered here.
"""
from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import CheckpointError, ConfigError
from .config import IMAGENET_MEAN, IMAGENET_STD, Preprocess


@dataclass(frozen=True)
class Family:
    name: str
    config: type  # a JsonConfig dataclass with `.replace(**overrides)` that validates
    model: type[nn.Module]  # model(cfg, preprocess=, class_names=, provenance=) implementing VitkitModel
    # closed-form {"params": {part: n}, "macs": {part: n}} from a config alone, where the family has one
    cost: Callable[[Any], dict[str, dict[str, int]]] | None = None
    # maps other libraries' keyword names (timm's) onto config fields; returns the translated overrides
    translate_kwargs: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # for foreign files whose importer gives no config: the reader of this family's config off a state dict in
    # its key names, `(state_dict, hints, source=) -> config`, named "module:function" and imported on first use
    # (see `read_config`). The reader lives in the weights layer (it says what it assumed through weights.notes,
    # and the importers call it), which models must never import (tests/test_layering.py), and it imports the
    # module that registers its family (weights.infer -> models.vit_variants): a name keeps the entry here with
    # neither an upward import nor a cycle. None: every importer of the family gives the config itself.
    infer_config: str | None = None
    # config fields a state dict's shapes do not show (a ViT's head count): a caller's override of one is what
    # the source states, handed to `infer_config` among the hints, so nothing is assumed for it
    unrecorded_fields: tuple[str, ...] = ()
    # config -> what makes two configs one architecture for preprocessing: a file that records no preprocessing
    # takes that of the registered names with the same key. None: every field but those a load adapts
    shape_key: Callable[[Any], tuple] | None = None
    # config -> a short shape ("384/12/6 patch 16"), the provenance `arch` of a changed registered architecture
    describe_shape: Callable[[Any], str] | None = None
    # (config, hints, source) -> None: what a foreign source states about the architecture (Imported.hints)
    # checked against the config of the model it is loaded into (raises CheckpointError, or logs)
    check_hints: Callable[[Any, dict[str, Any], str], None] | None = None

    def read_config(self, state_dict: dict, hints: dict[str, Any], source: str):
        """This family's config read off `state_dict` (in its key names) by `infer_config`; a family without a
        reader, or weights that do not form one of its models, is a CheckpointError naming the family."""
        if self.infer_config is None:
            raise CheckpointError(f"{source}: its importer gives no {self.name} config and the {self.name} family "
                                  "cannot read one off the weights; name the architecture: --model NAME "
                                  "(load_model(..., model_name=NAME); `vitkit models` lists the names)")
        module, _, function = self.infer_config.partition(":")
        reader = getattr(importlib.import_module(module), function)
        try:
            return reader(state_dict, hints, source=source)
        except Exception as e:  # shapes that do not form one of this family's models: what is wrong, and where
            raise CheckpointError(f"{source}: cannot infer a {self.name} architecture from the weights ({e})") \
                from None


@dataclass(frozen=True)
class Pretrained:
    """One set of published weights (torchvision's weight-enum metadata, as far as the source states it)."""

    hub: str  # Hugging Face hub repo with timm-format weights (model.safetensors)
    top1: float | None = None  # ImageNet-1k top-1 as published by the source
    license: str | None = None


@dataclass
class ModelEntry:
    name: str
    family: str
    cfg: Any  # the family's config for this name
    group: str = ""  # a label for listings: deit, dinov2, clip, small-images, ...
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    pretrained: dict[str, Pretrained] = field(default_factory=dict)  # tag -> weights
    notes: str = ""

    @property
    def hub(self) -> dict[str, str]:
        """tag -> hub repo."""
        return {tag: p.hub for tag, p in self.pretrained.items()}

    def config(self, **overrides: Any):
        """This name's config with `overrides` (validated; timm keyword names translated)."""
        fam = get_family(self.family)
        if overrides and fam.translate_kwargs is not None:
            overrides = fam.translate_kwargs(overrides)
        return self.cfg.replace(**overrides)

    def preprocess(self, cfg) -> Preprocess:
        return Preprocess(self.mean, self.std, self.interpolation, self.crop_pct,
                          (cfg.in_chans, *cfg.img_size)).for_channels(cfg.in_chans)

    def build(self, **overrides: Any) -> nn.Module:
        cfg = self.config(**overrides)
        return get_family(self.family).model(cfg, preprocess=self.preprocess(cfg), provenance={"arch": self.name})


FAMILIES: dict[str, Family] = {}
_REGISTRY: dict[str, ModelEntry] = {}


def register_family(name: str, config: type, model: type[nn.Module], cost=None, translate_kwargs=None,
                    **entry_fields: Any) -> Family:
    """`entry_fields`: the optional Family fields by name (infer_config, shape_key, ...)."""
    FAMILIES[name] = Family(name, config, model, cost, translate_kwargs, **entry_fields)
    model.family = name  # the family travels with every instance (save_model writes it)
    return FAMILIES[name]


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def register_model(name: str, family: str, cfg: Any, **entry_fields: Any) -> ModelEntry:
    if name in _REGISTRY:
        raise ConfigError(f"model name {name!r} is registered twice")
    if not isinstance(cfg, get_family(family).config):
        raise ConfigError(f"{name}: a {family} model needs a {get_family(family).config.__name__}")
    _REGISTRY[name] = ModelEntry(name, family, cfg, **entry_fields)
    return _REGISTRY[name]


def list_models(pattern: str | None = None, family: str | None = None) -> list[str]:
    """Registered names, sorted; `pattern` is a shell-style wildcard (e.g. 'deit*'), `family` e.g. 'resnet'."""
    names = sorted(n for n, e in _REGISTRY.items() if family is None or e.family == family)
    if pattern:
        pat = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
        names = [n for n in names if fnmatch.fnmatch(n, pat)]
    return names


def get_entry(name: str) -> ModelEntry:
    """The entry for a name; a pretrained tag after a dot ('vit_base_patch16_224.augreg_in21k') is ignored."""
    base = name.split(".", 1)[0]
    if base not in _REGISTRY:
        from .vit_catalogue import refusal  # timm names refused on purpose, with the reason

        why = refusal(base)
        if why:
            raise ConfigError(f"{base} is not built by vitkit: {why} (see docs/catalogue.md)")
        import difflib

        close = difflib.get_close_matches(base, list(_REGISTRY), n=5, cutoff=0.6)  # most similar first
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise ConfigError(f"unknown model {name!r} (see `vitkit models`){hint}")
    return _REGISTRY[base]


def model_config(name: str, **overrides):
    """The config for a registered name, with overrides applied (validated)."""
    return get_entry(name).config(**overrides)
