"""NaFlex training (timm's NaFlexViT recipe; NaViT's idea): every image at its own aspect ratio within a token
budget (`recipe.max_tokens`), batches padded and masked (layers/naflex.py), and batches formed by token budget: a
step at sequence length s holds batch_size * max_tokens // s images, s drawn from `recipe.token_lens`, so a step
costs about the same whatever its length and short sequences train on more images.

An epoch is whole rounds: each round has one step per length (their order shuffled by seed and epoch), so every
epoch has the same number of steps, the LR schedule and time budgets plan as for square batches, and the order is a
pure function of (seed, epoch): resume and DDP reproduce a plain run. Each index goes out as (image, length): the
dataset hands the length to the transform (data.transforms.BudgetTrainTransform).
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


def check(model: nn.Module, task, recipe) -> None:
    """One line unless a NaFlex run can be made: a model that takes padded batches of any grid, an objective whose
    loss takes any number of tokens, and no batch-level mixing (MixUp / CutMix pair square images)."""
    if not recipe.max_tokens:
        return
    if "native_aspect" not in getattr(model, "capabilities", ()):
        raise ConfigError("max_tokens: this model cannot take images at their own aspect ratio (ViTs with a patch "
                          "embedding can)")
    model._check_native_aspect()
    if not getattr(task, "padded_batches", False):
        raise ConfigError(f"max_tokens: the {type(task).__name__} objective takes square image batches; NaFlex "
                          "trains classifiers (task=classification)")
    if recipe.mixup or recipe.cutmix:
        raise ConfigError("max_tokens: MixUp / CutMix mix images of one shape; set mixup=0 cutmix=0 for a NaFlex run")
    if recipe.flexi_patch_sizes:
        raise ConfigError("max_tokens and flexi_patch_sizes together are not supported: choose one")


def lengths(recipe) -> tuple[int, ...]:
    return tuple(recipe.token_lens) or (recipe.max_tokens,)


def images_per_step(recipe, length: int, multiple: int) -> int:
    """batch_size * max_tokens // length, rounded down to a multiple of `multiple` (accumulation x processes)."""
    n = recipe.batch_size * recipe.max_tokens // length
    return max(multiple, n // multiple * multiple)


def epoch_batches(n: int, recipe, epoch: int, rank: int, world: int, perm: list[int]) -> list[list[list]]:
    """Per optimiser step, this rank's micro-batches of (index, sequence length) pairs: whole rounds of one step per
    length, images taken in `perm` order; the incomplete last round is dropped."""
    A = recipe.accum_steps
    lens = lengths(recipe)
    sizes = [images_per_step(recipe, s, A * world) for s in lens]
    rounds = n // sum(sizes)
    if recipe.steps_per_epoch:
        rounds = min(rounds, max(1, recipe.steps_per_epoch // len(lens)))
    if rounds == 0:
        raise ConfigError(f"one round of token-budget steps needs {sum(sizes)} images ({', '.join(map(str, sizes))} at "
                          f"lengths {', '.join(map(str, lens))}); the training set has {n}: lower --batch-size")
    g = torch.Generator().manual_seed(recipe.seed * 1000 + epoch + 7)
    out, at = [], 0
    for _ in range(rounds):
        for k in torch.randperm(len(lens), generator=g).tolist():
            B, s = sizes[k], lens[k]
            glob = perm[at:at + B]
            at += B
            micro, per_rank = B // A, B // (A * world)
            out.append([[(i, s) for i in glob[m * micro:(m + 1) * micro][rank * per_rank:(rank + 1) * per_rank]]
                        for m in range(A)])
    return out
