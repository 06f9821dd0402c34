"""The data order: which images each rank trains on at each optimiser step.

Determinism by construction, so that `--resume` and DDP reproduce a plain run:
- the data order of epoch e is a permutation seeded by (seed, e); a global batch is sliced across ranks
  and accumulation steps, so the set of images per optimiser step does not depend on the world size;
- augmentation randomness is seeded per (seed, epoch, image index) (data.datasets.Transformed);
- MixUp/CutMix, dropout and stochastic depth are seeded per (seed, step, rank) before each step
  (`step_seed`; the loop reseeds torch's CPU generator with it, the task draws from it);
- the LR is a function of the optimiser step (optim.lr_factor), so the "scheduler state" is the step counter.
"""
from __future__ import annotations

import torch

from ..data.datasets import sample_seed
from ..errors import ConfigError
from .distributed import Dist


def epoch_batches(n: int, recipe, epoch: int, d: Dist) -> list[list[list[int]]]:
    """Per optimiser step, this rank's micro-batches (lists of indices). Drops the incomplete last batch."""
    g = torch.Generator().manual_seed(recipe.seed * 1000 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    B, A = recipe.batch_size, recipe.accum_steps
    if B % (A * d.world):
        raise ConfigError(f"batch_size {B} must be divisible by accum_steps x processes = {A * d.world}")
    if recipe.max_tokens:  # NaFlex: steps sized by token budget (training/token_budget.py)
        from .token_budget import epoch_batches as token_budget_batches

        return token_budget_batches(n, recipe, epoch, d.rank, d.world, perm)
    steps = n // B
    if recipe.steps_per_epoch:
        steps = min(steps, recipe.steps_per_epoch)
    if steps == 0:
        raise ConfigError(f"batch_size {B} is larger than the training set ({n} images): lower --batch-size")
    micro, per_rank = B // A, B // (A * d.world)
    out = []
    for s in range(steps):
        glob = perm[s * B:(s + 1) * B]
        out.append([glob[m * micro:(m + 1) * micro][d.rank * per_rank:(d.rank + 1) * per_rank] for m in range(A)])
    return out


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of torch's CPU generator for optimiser step `step` on `rank` (mixing, dropout, drop-path)."""
    return sample_seed(seed, step, 1_000_000 + rank)
