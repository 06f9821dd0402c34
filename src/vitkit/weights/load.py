"""Put a vitkit-named state dict into a model: the adaptations people need, and clear errors otherwise.

- a different number of classes: the head is re-initialised (one log line);
- a different resolution: the position table is resampled (prefix rows untouched);
- a 1-channel model from 3-channel weights (or the reverse): the patch filters are summed / spread;
- anything else that does not fit: one error naming the key, both shapes and the likely cause.
"""
from __future__ import annotations

import logging
import math

import torch

from ..errors import CheckpointError
from ..layers import resample_pos_embed
from .convert import StateDict

log = logging.getLogger("vitkit")

_HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")


def adapt_in_chans(w: torch.Tensor, in_chans: int) -> torch.Tensor:
    """[D, C, p, p] patch filters -> [D, in_chans, p, p] so the response to a gray image is preserved."""
    c = w.shape[1]
    if c == in_chans:
        return w
    if in_chans == 1:
        return w.sum(dim=1, keepdim=True)
    if c == 1:
        return w.repeat(1, in_chans, 1, 1) / in_chans
    reps = math.ceil(in_chans / c)
    return w.repeat(1, reps, 1, 1)[:, :in_chans] * (c / in_chans)


def load_into(model, sd: StateDict, strict: bool = True, source: str = "checkpoint") -> dict[str, list[str]]:
    """Load `sd` into `model` (a VisionTransformer) with resolution, class-count and channel adaptation.

    Returns {'missing': [...], 'unexpected': [...], 'reinitialized': [...]}. With `strict`, missing or
    unexpected keys (other than a re-initialised head) raise a CheckpointError listing them.
    """
    sd = dict(sd)
    own = model.state_dict()
    reinit: list[str] = []

    # position table: resample the grid part to the model's grid
    if "pos_embed" in sd and model.pos_embed is not None and sd["pos_embed"].shape != own["pos_embed"].shape:
        src = sd["pos_embed"]
        n_prefix = model._pos_prefix
        grid_rows = src.shape[1] - n_prefix
        side = math.isqrt(grid_rows)
        if src.shape[-1] != own["pos_embed"].shape[-1]:
            raise CheckpointError(
                f"{source}: shape mismatch for pos_embed: checkpoint {tuple(src.shape)} vs model "
                f"{tuple(own['pos_embed'].shape)} (a different model width: check --model)")
        if side * side != grid_rows:
            raise CheckpointError(
                f"{source}: pos_embed {tuple(src.shape)} cannot be resampled to {tuple(own['pos_embed'].shape)}: "
                f"{grid_rows} grid rows do not form a square grid "
                "(does the checkpoint's prefix-token layout match the model's `prefix_pos`?)")
        sd["pos_embed"] = resample_pos_embed(
            src, model.patch_embed.grid_size, (side, side), n_prefix,
            model.cfg.pos_interpolation, model.cfg.pos_antialias)
        log.info("%s: resampled position embeddings from %dx%d to %dx%d", source, side, side,
                 *model.patch_embed.grid_size)

    w = sd.get("patch_embed.proj.weight")
    if w is not None and w.ndim == 4 and w.shape[1] != model.cfg.in_chans and w.shape[0] == model.embed_dim \
            and w.shape[2:] == own["patch_embed.proj.weight"].shape[2:]:
        sd["patch_embed.proj.weight"] = adapt_in_chans(w, model.cfg.in_chans)
        log.info("%s: adapted %d-channel patch embedding to %d channels", source, w.shape[1], model.cfg.in_chans)

    # a head for other classes (or none at all) is re-initialised, not loaded
    head_mismatch = any(k in sd and k in own and sd[k].shape != own[k].shape for k in _HEAD_KEYS)
    if head_mismatch or (model.num_classes == 0 and any(k in sd for k in _HEAD_KEYS)):
        src_classes = sd["head.weight"].shape[0] if "head.weight" in sd else "?"
        for k in _HEAD_KEYS:
            if k in sd:
                sd.pop(k)
                if k in own:
                    reinit.append(k)
        if model.num_classes:
            log.warning("%s: head has %s classes, model has %d: head re-initialised (train it before use)",
                        source, src_classes, model.num_classes)
    elif "head.weight" not in sd and model.num_classes and "head.weight" in own:
        reinit.extend(k for k in _HEAD_KEYS if k in own)
        log.warning("%s: no classifier head in the checkpoint: head of %d classes initialised fresh",
                    source, model.num_classes)

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
        raise CheckpointError(f"{source} does not fit {model.cfg.embed_dim}-wide depth-{model.cfg.depth} model: "
                              + "; ".join(parts) + " (wrong --model for this checkpoint?)")
    own_dtype = {k: t.dtype for k, t in own.items()}
    sd = {k: (v.to(own_dtype[k]) if k in own_dtype and v.is_floating_point() else v) for k, v in sd.items()}
    model.load_state_dict(sd, strict=False)
    return {"missing": missing, "unexpected": unexpected, "reinitialized": reinit}


def _likely_cause(key: str) -> str:
    if key.startswith("blocks.") and "mlp" in key:
        return " (a different MLP ratio or model size: check --model)"
    if key.startswith(("blocks.", "patch_embed")):
        return " (a different model width or patch size: check --model)"
    if key in ("cls_token", "reg_token", "dist_token"):
        return " (a different number of prefix tokens)"
    return ""
