"""Every foreign checkpoint layout becomes timm/vitkit key names through one small filter.

A layout is registered with `@layout(name, detect, family=...)`; `to_vitkit(raw)` unwraps training
containers, strips wrapper prefixes, detects the layout by key signature and runs its filter. This runs on
every load path: `create_model(checkpoint_path=...)`, `load_model`, `vitkit convert`, fine-tuning.

A layout declares the model family it produces (`vit` unless it says otherwise, e.g. `swin`). A ViT's
architecture is read off the shapes by weights.infer; an importer of another family returns its config
in `Imported.config`.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CheckpointError

log = logging.getLogger("vitkit")

StateDict = dict[str, torch.Tensor]


@dataclass
class Imported:
    """A state dict in vitkit names, plus what the source told us about the architecture."""

    state_dict: StateDict
    layout: str
    hints: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields known from the source
    dropped: list[str] = field(default_factory=list)  # source keys that have no place in the encoder
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


LAYOUTS: list[Layout] = []


def layout(name: str, detect: Callable[[StateDict], bool], priority: int = 0, family: str = "vit"):
    """Register `convert(sd, hf_config) -> Imported` for checkpoints whose keys satisfy `detect`; the
    weights it returns belong to `family`."""

    def register(fn):
        LAYOUTS.append(Layout(name, detect, fn, priority, family))
        LAYOUTS.sort(key=lambda lay: -lay.priority)
        return fn

    return register


# Training scripts wrap the weights: DeiT/MAE {'model': sd}, DINO {'teacher': sd, 'student': sd},
# Lightning {'state_dict': sd}, EMA copies. The first container found in this order wins.
CONTAINERS = ("model_ema", "teacher", "model", "state_dict", "module", "net", "params")
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "backbone.", "model.")


def _is_tensor_dict(d: Any) -> bool:
    return isinstance(d, dict) and d and all(isinstance(v, torch.Tensor) for v in d.values())


def unwrap(raw: dict[str, Any], prefer: str | None = None) -> StateDict:
    """Find the state dict inside a training checkpoint and drop non-tensor entries."""
    if prefer is not None:
        if prefer not in raw:
            raise CheckpointError(f"checkpoint has no {prefer!r} entry; it has {sorted(raw)[:10]}")
        raw = raw[prefer]
    elif not _is_tensor_dict(raw):
        for key in CONTAINERS:
            if key in raw and isinstance(raw[key], dict):
                inner = raw[key]
                if _is_tensor_dict({k: v for k, v in inner.items() if isinstance(v, torch.Tensor)}):
                    log.info("using the %r entry of the checkpoint", key)
                    raw = inner
                    break
    sd = {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}
    if not sd:
        raise CheckpointError("no tensors found in the checkpoint (is it an optimizer or config file?)")
    return strip_prefixes(sd)


def strip_prefixes(sd: StateDict) -> StateDict:
    """Remove wrapper prefixes: DDP `module.`, torch.compile `_orig_mod.`, DINO `backbone.`, `model.`.

    Each prefix in WRAPPER_PREFIXES is tried in turn, repeatedly, until none applies (so `module._orig_mod.`
    goes too). A prefix is stripped when at least one key that carries it looks like a model key (its name
    matches patch_embed|embeddings|conv1|conv_proj|blocks|embedding); `model.` additionally needs every key
    to carry it. Keys without the prefix are kept as they are, except for `backbone.`, where they are
    dropped (the DINO head lives outside the backbone)."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            carriers = [k for k in sd if k.startswith(prefix)]
            if carriers and any(re.search(r"patch_embed|embeddings|conv1|conv_proj|blocks|embedding", k)
                                for k in carriers):
                if prefix == "model." and not all(k.startswith(prefix) for k in sd):
                    continue
                kept = {}
                for k, v in sd.items():
                    if k.startswith(prefix):
                        kept[k[len(prefix):]] = v
                    elif prefix == "backbone.":
                        continue  # DINO: anything outside the backbone (the DINO head) goes
                    else:
                        kept[k] = v
                sd = kept
                changed = True
    return sd


def detect_layout(sd: StateDict) -> Layout:
    _load_importers()
    for lay in LAYOUTS:
        try:
            if lay.detect(sd):
                return lay
        except Exception:  # a detector must never crash on odd input
            continue
    sample = ", ".join(sorted(sd)[:6])
    raise CheckpointError(
        "unrecognised checkpoint layout (known: " + ", ".join(sorted({lay.name for lay in LAYOUTS})) +
        f"); first keys: {sample}")


def to_vitkit(raw: dict[str, Any], hf_config: dict | None = None, prefer: str | None = None) -> Imported:
    """Any supported checkpoint (already read into a dict) -> vitkit/timm names."""
    sd = unwrap(raw, prefer)
    lay = detect_layout(sd)
    out = lay.convert(sd, hf_config)
    out.layout = out.layout or lay.name
    out.family = lay.family
    # importers may return what is not config under these two hint keys
    out.preprocess = out.hints.pop("_preprocess", out.preprocess)
    out.class_names = out.hints.pop("_class_names", out.class_names)
    return out


_loaded = False


def _load_importers() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        from . import importers  # noqa: F401  (registers the layouts)
