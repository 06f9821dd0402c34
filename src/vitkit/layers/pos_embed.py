"""Position embeddings: the one resample function, and fixed 2D sin-cos tables."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 0,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resize a [1, P + Gh*Gw, D] position table to a new (Gh', Gw') grid.

    The first `num_prefix_tokens` rows (class/distillation/register positions) are kept as they are;
    the grid is interpolated in float32 and cast back. `old_size` defaults to a square grid.
    """
    n_grid = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = math.isqrt(n_grid)
        if side * side != n_grid:
            raise ValueError(
                f"position table has {n_grid} grid entries, not a square; pass old_size=(h, w)"
            )
        old_size = (side, side)
    old_size = (int(old_size[0]), int(old_size[1]))
    new_size = (int(new_size[0]), int(new_size[1]))
    if old_size[0] * old_size[1] != n_grid:
        raise ValueError(f"old grid {old_size} does not hold {n_grid} entries")
    if tuple(new_size) == tuple(old_size):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim, dtype = grid.shape[-1], grid.dtype
    grid = grid.float().reshape(1, old_size[0], old_size[1], dim).permute(0, 3, 1, 2)  # [1, D, h, w]
    kwargs = {"antialias": antialias} if interpolation in ("bilinear", "bicubic") else {}
    if interpolation in ("bilinear", "bicubic"):
        kwargs["align_corners"] = False
    grid = F.interpolate(grid, size=new_size, mode=interpolation, **kwargs)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_size[0] * new_size[1], dim).to(dtype)  # [1, h'w', D]
    return torch.cat([prefix, grid], dim=1)


def sincos_2d_pos_embed(
    dim: int, grid_size: tuple[int, int], temperature: float = 10000.0, *, w_first: bool = True
) -> torch.Tensor:
    """Fixed 2D sin-cos table, [Gh*Gw, D], rows in raster order (row-major over the (h, w) grid).

    Channels are `[sin w, cos w, sin h, cos h]`, each D/4 wide, with frequencies
    `omega_k = 1 / temperature ** (k / (D/4))`, k = 0 .. D/4-1. This is the table of MAE's
    `get_2d_sincos_pos_embed` (its `meshgrid(grid_w, grid_h)` feeds the column to the first half),
    and MoCo v3's. big_vision's `posemb_sincos_2d` has the same channel order but spaces the
    frequencies as `k / (D/4 - 1)`; pass `temperature=T ** (q / (q - 1))` with q = D/4 to get it.

    `w_first=False` gives the table older vitkit versions generated, `[sin h, cos h, sin w, cos w]`
    (row first); models trained with it need it to be regenerated the same way.
    """
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")
    gh, gw = grid_size  # ints, or symbolic sizes inside an ONNX export (int() would freeze them)
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4.0))  # [D/4]

    def encode(pos: torch.Tensor) -> torch.Tensor:  # [Gh, Gw] -> [Gh*Gw, D/2]
        out = pos.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([out.sin(), out.cos()], dim=1)

    hh, ww = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    halves = [encode(ww), encode(hh)] if w_first else [encode(hh), encode(ww)]
    return torch.cat(halves, dim=1).float()  # [Gh*Gw, D]
