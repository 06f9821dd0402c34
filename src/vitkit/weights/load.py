"""Put a state dict in a family's key names into a model: the adaptations people need, clear errors otherwise.

- the model's own `adapt_checkpoint(sd, source)` first, where its family has one (a ViT resamples its
  position table to its grid and adapts 1-/3-channel patch filters);
- a head for a different number of classes (or none at all) is re-initialised, with one log line: the
  heads are the modules the model names in `head_names`;
- anything else that does not fit: one error naming the key, both shapes and the likely cause.
"""
from __future__ import annotations

import logging

from torch import nn

from ..errors import CheckpointError
from .layouts import StateDict

log = logging.getLogger("vitkit")


def head_keys(model: nn.Module, keys) -> list[str]:
    """The keys among `keys` that belong to the model's classifier head(s)."""
    names = tuple(f"{h}." for h in getattr(model, "head_names", ()))
    return [k for k in keys if k.startswith(names)] if names else []


def load_into(model: nn.Module, sd: StateDict, strict: bool = True, source: str = "checkpoint") -> dict[str, list[str]]:
    """Load `sd` into `model` (any registered family) with its adaptations.

    Returns {'missing': [...], 'unexpected': [...], 'reinitialized': [...]}. With `strict`, missing or
    unexpected keys (other than a re-initialised head) raise a CheckpointError listing them.
    """
    if hasattr(model, "adapt_checkpoint"):
        sd = model.adapt_checkpoint(sd, source)
    sd = dict(sd)
    own = model.state_dict()
    reinit: list[str] = []

    # a head for other classes (or none at all) is re-initialised, not loaded
    src_head, own_head = head_keys(model, sd), head_keys(model, own)
    head_mismatch = any(k in own and sd[k].shape != own[k].shape for k in src_head)
    num_classes = getattr(model, "num_classes", None)
    if head_mismatch or (num_classes == 0 and src_head):
        weight = next((sd[k] for k in src_head if k.endswith(".weight")), None)
        src_classes = weight.shape[0] if weight is not None else "?"
        for k in src_head:
            sd.pop(k)
        reinit.extend(own_head)
        if num_classes:
            log.warning("%s: head has %s classes, model has %d: head re-initialised (train it before use)",
                        source, src_classes, num_classes)
    elif not src_head and own_head:
        reinit.extend(own_head)
        log.warning("%s: no classifier head in the checkpoint: head of %d classes initialised fresh",
                    source, num_classes)

    for k, v in sd.items():
        if k in own and own[k].shape != v.shape:
            raise CheckpointError(
                f"{source}: shape mismatch for {k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                f"{_likely_cause(k)}")
    missing = [k for k in own if k not in sd and k not in reinit]
    unexpected = [k for k in sd if k not in own]
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} key(s): {', '.join(unexpected[:8])}"
                         + (" ..." if len(unexpected) > 8 else ""))
        raise CheckpointError(f"{source} does not fit {_describe(model)}: " + "; ".join(parts)
                              + " (wrong --model for this checkpoint?)")
    own_dtype = {k: t.dtype for k, t in own.items()}
    sd = {k: (v.to(own_dtype[k]) if k in own_dtype and v.is_floating_point() else v) for k, v in sd.items()}
    model.load_state_dict(sd, strict=False)
    return {"missing": missing, "unexpected": unexpected, "reinitialized": reinit}


def _describe(model: nn.Module) -> str:
    cfg = getattr(model, "cfg", None)
    if hasattr(cfg, "embed_dim") and hasattr(cfg, "depth"):
        return f"{cfg.embed_dim}-wide depth-{cfg.depth} model"
    return f"the {getattr(model, 'family', type(model).__name__)} model {getattr(cfg, 'arch', '')}".rstrip()


def _likely_cause(key: str) -> str:
    if key.startswith("blocks.") and "mlp" in key:
        return " (a different MLP ratio or model size: check --model)"
    if key.startswith(("blocks.", "patch_embed")):
        return " (a different model width or patch size: check --model)"
    if key in ("cls_token", "reg_token", "dist_token"):
        return " (a different number of prefix tokens)"
    return ""
