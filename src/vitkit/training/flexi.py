"""FlexiViT training (Beyer et al. 2023): every optimiser step draws one patch size from
`recipe.flexi_patch_sizes` and the model cuts patches of that size, its one kernel resampled in the forward
(layers.patch_embed: the pseudo-inverse resize, differentiable) and its positions resampled to the grid, so the
weights learn to run at each size. Evaluation and the saved checkpoint stay at the model's own patch size;
`--patch-size P` (or `vitkit tradeoff`) then runs it at any of them.

The draw is a pure function of the seed and the step, the same on every rank, so resume and DDP need no state.
"""
from __future__ import annotations

import contextlib
import random

from torch import nn

from ..errors import ConfigError


def check(model: nn.Module, task, sizes: tuple[int, ...]) -> None:
    """One line unless every size can be cut: a model that resamples its patch kernel, an objective whose loss
    takes any number of tokens, and an image side each size divides."""
    if not sizes:
        return
    if "patch_resample" not in getattr(model, "capabilities", ()) or not hasattr(model.patch_embed, "cutting"):
        raise ConfigError("flexi_patch_sizes: this model cannot change its patch size (ViTs with a linear patch "
                          "embedding can)")
    if not getattr(task, "any_token_count", False):
        raise ConfigError(f"flexi_patch_sizes: the {type(task).__name__} objective works on a fixed patch grid; "
                          "random patch sizes train classifiers (task=classification or distillation)")
    h, w = model.patch_embed.img_size
    bad = [p for p in sizes if h % p or w % p]
    if bad:
        fits = [p for p in range(1, min(h, w) + 1) if h % p == 0 and w % p == 0]
        raise ConfigError(f"flexi_patch_sizes {bad} do not divide the {h}x{w} input; sizes that do: "
                          f"{', '.join(map(str, fits))}")


def size_for_step(sizes: tuple[int, ...], seed: int, step: int) -> int:
    return sizes[random.Random(f"flexi:{seed}:{step}").randrange(len(sizes))]


def cutting(model: nn.Module, sizes: tuple[int, ...], seed: int, step: int):
    """The context the step's forward and backward run in: patches of this step's size (none without sizes)."""
    if not sizes:
        return contextlib.nullcontext()
    return model.patch_embed.cutting(size_for_step(sizes, seed, step))
