"""Mean attention distance (ViT paper, Fig. 7 right and App. D.7): how far, in pixels, each head looks.

Per head: for every query patch, the attention-weighted Euclidean distance (in pixels) to the key
patches, averaged over queries and images. Prefix tokens (class, distillation, registers) are dropped
as queries and keys WITHOUT renormalising the rows, as in the reference implementation (Raghu /
Kornblith, probing-vits): attention that goes to a prefix token counts as distance zero.
"""
from __future__ import annotations

import torch


def pixel_distances(grid: tuple[int, int], patch_size: int | tuple[int, int]) -> torch.Tensor:
    """[N, N] Euclidean distance in pixels between the centres of the patches of a row-major grid."""
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    gh, gw = grid
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    pos = torch.stack([rows.flatten() * ph, cols.flatten() * pw], dim=-1).double()  # [N, 2] pixels
    return torch.cdist(pos, pos)


def mean_attention_distance(attns: list[torch.Tensor], grid: tuple[int, int], patch_size,
                            num_prefix_tokens: int) -> torch.Tensor:
    """Per-block attention [B, H, T, T] -> [B, L, H] mean distance in pixels, per image."""
    P = num_prefix_tokens
    dist = pixel_distances(grid, patch_size).to(attns[0].device)  # [N, N]
    out = []
    for attn in attns:
        a = attn[..., P:, P:].double()  # [B, H, N, N], rows not renormalised
        per_query = (a * dist).sum(dim=-1)  # [B, H, N]
        out.append(per_query.mean(dim=-1))  # [B, H]
    return torch.stack(out, dim=1).float()  # [B, L, H]


@torch.no_grad()
def model_attention_distance(model, x: torch.Tensor) -> torch.Tensor:
    """[B, L, H] mean attention distance of `model` on images x [B, C, H, W]."""
    _, attns = model(x, return_attn=True)
    grid = model.patch_embed.grid_for(x.shape[-2], x.shape[-1])
    return mean_attention_distance(attns, grid, model.patch_embed.patch_size, model.num_prefix_tokens)
