"""Every foreign checkpoint layout becomes a family's key names through one small filter.

A layout is registered with `@layout(name, detect, family=...)` (weights.layouts); `to_vitkit(raw)` unwraps
training containers, strips wrapper prefixes, detects the layout by key signature and runs its filter. This
runs on every load path: `create_model(checkpoint_path=...)`, `load_model`, `vitkit convert`, fine-tuning.

A layout declares the model family it produces (`vit` unless it says otherwise: `swin`, and the whole models of
pretraining files: `clip` for a CLIP pair, `mae` for an MAE with its decoder, `dino` for a DINO backbone with its
head). A ViT's architecture is read off the shapes by weights.infer; an importer of another family returns its
config in `Imported.config`.
"""
from __future__ import annotations

import logging
import re
from typing import Any

import torch

from ..errors import CheckpointError
from . import importers  # noqa: F401  (each importer registers its layouts in LAYOUTS)
from .layouts import LAYOUTS, Imported, Layout, StateDict, layout

__all__ = ["LAYOUTS", "Imported", "Layout", "StateDict", "detect_layout", "layout", "strip_prefixes", "to_vitkit",
           "unwrap"]

log = logging.getLogger("vitkit")


# Training scripts wrap the weights: DeiT/MAE {'model': sd}, DINO {'teacher': sd, 'student': sd},
# Lightning {'state_dict': sd}, EMA copies. The first container found in this order wins.
CONTAINERS = ("model_ema", "teacher", "model", "state_dict", "module", "net", "params")
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "backbone.", "model.")
DINO_HEAD_PREFIX = "head."  # DINO v1's MultiCropWrapper: `backbone.*` beside `head.*`


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
    to carry it. Keys without the prefix are kept as they are, except for `backbone.`, where only DINO's
    `head.*` (its projection head, which the `dino` layout reads) is kept and the rest (DINOv2's
    `dino_head`/`ibot_head`) dropped."""
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
                    elif prefix == "backbone." and not k.startswith(DINO_HEAD_PREFIX):
                        continue  # DINOv2's heads outside the backbone have no vitkit model
                    else:
                        kept[k] = v
                sd = kept
                changed = True
    return sd


def detect_layout(sd: StateDict) -> Layout:
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
    """Any supported checkpoint (already read into a dict) -> its family's names."""
    sd = unwrap(raw, prefer)
    lay = detect_layout(sd)
    out = lay.convert(sd, hf_config)
    out.layout = out.layout or lay.name
    out.family = lay.family
    return out
