"""Token merging (ToMe; Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023), as
facebookresearch/ToMe does it for timm's ViT, on any checkpoint and without training.

After its attention, each block merges its `r` most similar token pairs, so later blocks run on fewer tokens:
- bipartite soft matching (`TokenMatch`, ToMe's `bipartite_soft_matching`): tokens alternate into a set A (even
  positions) and B (odd positions); every A token finds its most similar B token by the cosine similarity of
  the attention keys (averaged over heads); the r A tokens with the most similar partners are merged into
  them, the other A tokens stay. Prefix tokens (class, distillation, registers) are never merged.
- merging by size-weighted average (`merge_wavg`): a token's size is how many patches it stands for.
- proportional attention (`size_bias`): log(size) is added to the attention logits of the keys, so a merged
  token draws the attention its patches would have drawn; it is an additive bias, so fused SDPA still runs.
A block merges at most half of its mergeable tokens (ToMe's rule), so a late block may merge fewer than r.
"""
from __future__ import annotations

import math

import torch

from ..errors import ConfigError


def check_merge(r, patches: int) -> None:
    """ConfigError unless `r` is a whole number of tokens the first block can merge for `patches` patch tokens."""
    most = patches // 2
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= most:
        raise ConfigError(f"merge={r!r}: token merging takes 0 to {most} tokens per block for {patches} patch tokens "
                          "(a block merges at most half of them)")


def merge_schedule(tokens: int, prefix: int, r: int, depth: int) -> list[int]:
    """Tokens merged by each of `depth` blocks entered by `tokens` tokens (`prefix` of them protected): r, or
    half of the mergeable tokens where fewer than 2r are left (ToMe's clamp)."""
    check_merge(r, tokens - prefix)
    merged = []
    for _ in range(depth):
        n = min(r, (tokens - prefix) // 2)
        merged.append(n)
        tokens -= n
    return merged


def tokens_per_block(tokens: int, prefix: int, r: int, depth: int) -> list[int]:
    """The tokens entering each block, then the tokens leaving the last one (depth + 1 counts)."""
    counts = [tokens]
    for n in merge_schedule(tokens, prefix, r, depth):
        counts.append(counts[-1] - n)
    return counts


class TokenMatch:
    """One block's bipartite soft matching on `metric` [B, T, C] (the keys, averaged over heads): which r tokens
    of set A merge into which tokens of set B. Calling it merges a tensor [B, T, C'] laid out like the metric
    into [B, T - r, C']: prefix tokens first in their order, then the unmerged A tokens (in position order when
    there are prefix tokens, as ToMe), then the B tokens."""

    def __init__(self, metric: torch.Tensor, r: int, prefix: int = 0):
        self.r = r
        # prefix token i sits in A (even i) or B (odd i): ToMe's class token is A's first, the distillation
        # token B's first
        self.prefix_a, self.prefix_b = (prefix + 1) // 2, prefix // 2
        with torch.no_grad():
            metric = metric / metric.norm(dim=-1, keepdim=True)
            a, b = metric[..., ::2, :], metric[..., 1::2, :]  # [B, ceil(T/2), C], [B, floor(T/2), C]
            scores = a @ b.transpose(-1, -2)  # [B, Ta, Tb] cosine similarities
            scores[..., : self.prefix_a, :] = -math.inf  # a prefix token in A never merges away
            scores[..., :, : self.prefix_b] = -math.inf  # nothing merges into a prefix token in B
            best, best_b = scores.max(dim=-1)  # [B, Ta]: each A token's most similar B token
            order = best.argsort(dim=-1, descending=True)[..., None]  # [B, Ta, 1], most similar pairs first
            self.unmerged = order[..., r:, :]  # [B, Ta - r, 1]
            self.merged = order[..., :r, :]  # [B, r, 1]: the A tokens merged away
            self.into = best_b[..., None].gather(dim=-2, index=self.merged)  # [B, r, 1]: their B partners
            if prefix:  # keep the prefix tokens at the front
                self.unmerged = self.unmerged.sort(dim=1)[0]

    def __call__(self, x: torch.Tensor, mode: str = "mean") -> torch.Tensor:
        a, b = x[..., ::2, :], x[..., 1::2, :]
        n, ta, c = a.shape
        kept = a.gather(dim=-2, index=self.unmerged.expand(n, ta - self.r, c))  # [B, Ta - r, C]
        moved = a.gather(dim=-2, index=self.merged.expand(n, self.r, c))  # [B, r, C]
        b = b.scatter_reduce(-2, self.into.expand(n, self.r, c), moved, reduce=mode)  # [B, Tb, C]
        if not self.prefix_b:
            return torch.cat([kept, b], dim=1)
        # prefix tokens alternate between the two sets: interleave them back into their original order
        front = []
        for i in range(self.prefix_a):
            front.append(kept[:, i:i + 1])
            if i < self.prefix_b:
                front.append(b[:, i:i + 1])
        return torch.cat([*front, kept[:, self.prefix_a:], b[:, self.prefix_b:]], dim=1)


def merge_wavg(match: TokenMatch, x: torch.Tensor, size: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [B, T, D] and their sizes [B, T, 1] (None: all 1) -> the merged tokens, each the size-weighted mean of
    what merged into it, and their summed sizes."""
    if size is None:
        size = torch.ones_like(x[..., 0, None])  # [B, T, 1]
    x = match(x * size, mode="sum")
    size = match(size, mode="sum")
    return x / size, size


def size_bias(size: torch.Tensor | None) -> torch.Tensor | None:
    """Proportional attention: sizes [B, T, 1] -> the additive attention bias log(size) on each key [B, 1, 1, T]."""
    return None if size is None else size.log()[:, None, None, :, 0]
