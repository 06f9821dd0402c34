"""Optimiser parameter groups (weight decay, layer-wise LR decay, head LR), the LR schedule and EMA.

Layer-wise LR decay follows timm (`timm.models._manipulate.group_with_matcher` and
`timm.optim._param_groups.param_groups_layer_decay`), so it works for any model that has a
`group_matcher()`: the matcher's regexes give each parameter an ordinal, ordinals ending in 99999 merge
into the previous group, unmatched parameters (the head) form the last group, and group g of G trains at
lr * decay ** (G - 1 - g).

One behaviour change against the old ViT-only `layer_id` rule: a ViT's final `norm` now shares the last
block's group (timm's `(r"^norm", (99999,))`), so it trains at lr * decay instead of the head's full lr.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

MATCH_PREV_GROUP = 99999.0  # an ordinal ending in this joins the group before it
DEFAULT_HEADS = ("head", "head_dist", "fc")


def _compile(matcher: dict) -> list[tuple[re.Pattern, tuple[float, ...], tuple | None]]:
    compiled = []
    for ordinal, spec in enumerate(matcher.values()):
        if spec is None:
            continue
        if isinstance(spec, (tuple, list)):  # [(regex, suffix), ...]
            compiled += [(re.compile(rx), (float(ordinal),), suffix) for rx, suffix in spec]
        else:
            compiled.append((re.compile(spec), (float(ordinal),), None))
    return compiled


def group_ids(names: Iterable[str], matcher: dict | Callable[[str], Any]) -> dict[str, int]:
    """Parameter name -> group index (0 = first), from a timm-style group matcher."""
    rules = _compile(matcher) if isinstance(matcher, dict) else None

    def ordinal(name: str) -> tuple[float, ...]:
        if rules is None:
            o = matcher(name)
            return tuple(map(float, o)) if isinstance(o, Iterable) else (float(o),)
        for rx, prefix, suffix in rules:
            m = rx.match(name)
            if m:
                return tuple(float(v) for part in (prefix, m.groups(), suffix) if part for v in part)
        return (math.inf,)  # unmatched (neck, head): after everything

    by_ordinal: dict[tuple[float, ...], list[str]] = {}
    for n in names:
        by_ordinal.setdefault(ordinal(n), []).append(n)
    out, gid = {}, -1
    for key in sorted(by_ordinal):
        if gid < 0 or key[-1] != MATCH_PREV_GROUP:
            gid += 1
        out |= {n: gid for n in by_ordinal[key]}
    return out


def layer_scales(model: nn.Module, decay: float) -> dict[str, float]:
    """Per-parameter LR multiplier decay ** (num_groups - 1 - group), from model.group_matcher()."""
    names = [n for n, _ in model.named_parameters()]
    ids = group_ids(names, model.group_matcher(coarse=False))
    last = max(ids.values(), default=0)
    return {n: decay ** (last - ids[n]) for n in names}


def _in(name: str, modules: Iterable[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def param_groups(model: nn.Module, recipe) -> list[dict[str, Any]]:
    """AdamW groups: no decay on norms/biases/1-d parameters and on `model.no_weight_decay()`; layer-wise LR
    decay (recipe.layer_decay, from `model.group_matcher()`) and a separate LR for the classifier head
    (recipe.head_lr; the modules in `model.head_names`). Each group carries its `base_lr` (the schedule
    multiplies it) and the parameter `names`."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    use_lld = recipe.layer_decay is not None and recipe.layer_decay < 1 and hasattr(model, "group_matcher")
    scales = layer_scales(model, recipe.layer_decay) if use_lld else {}
    heads = getattr(model, "head_names", DEFAULT_HEADS)
    groups: dict[tuple, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_wd = p.ndim <= 1 or name.endswith(".bias") or name in skip
        if recipe.head_lr is not None and _in(name, heads):
            base_lr = recipe.head_lr
        else:
            base_lr = recipe.lr * scales.get(name, 1.0)
        g = groups.setdefault((no_wd, base_lr), {"params": [], "names": [], "base_lr": base_lr, "lr": base_lr,
                                                 "weight_decay": 0.0 if no_wd else recipe.weight_decay})
        g["params"].append(p)
        g["names"].append(name)
    return list(groups.values())


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to `min_ratio` (per optimiser step)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_ema(model: nn.Module, decay: float):
    from torch.optim.swa_utils import AveragedModel

    def ema_update(ema_params, params, num_averaged):
        # warm-up of the decay (as timm's ModelEmaV3): early weights are not frozen in for thousands of steps
        n = float(num_averaged)
        d = min(decay, (1 + n) / (10 + n))
        floats = [(e, p) for e, p in zip(ema_params, params) if e.is_floating_point()]
        if floats:
            torch._foreach_lerp_([e for e, _ in floats], [p for _, p in floats], 1 - d)
        for e, p in zip(ema_params, params):  # counters (BatchNorm's num_batches_tracked) are copied
            if not e.is_floating_point():
                e.copy_(p)

    return AveragedModel(model, multi_avg_fn=ema_update, use_buffers=True)
