"""2D rotary position embeddings (RoPE) for ViT patch tokens: each head's query and key channels are rotated in
pairs by angles that grow with the patch's row and column, so attention scores depend on relative position.

Three kinds, as timm's EVA-family models use them:
- `axial` (timm's RotaryEmbeddingCat; RoPE-ViT, EVA-02, Perception Encoder): integer patch indices
  (+ `grid_offset`), optionally rescaled to a reference grid (`ref_grid`, EVA's resize rule), frequencies
  1 / temperature^(k / K) for k < K = head_dim / 4.
- `dinov3` (timm's RotaryEmbeddingDinoV3): patch centres normalised to [-1, 1] per axis, angles
  2 pi c / temperature^(2k / (head_dim / 2)).
- `mixed` (timm's RotaryEmbeddingMixed; RoPE-Mixed, Heo et al. 2024): every block and head learns its own 2D
  frequency vectors (`freqs` [2, depth, heads, head_dim/2]), angle = column * f_x + row * f_y; one table per block.
In the first two, half the frequencies rotate by the row, half by the column (`xy=True` puts the column first, as timm's
grid_indexing='xy'). Pairs are adjacent channels (x0, x1), (x2, x3), ... or, with `rotate_half`, channel i with
channel i + head_dim/2 (the GPT-NeoX / DINOv3 layout). Prefix tokens (class, registers) are not rotated.
"""
from __future__ import annotations

import math

import torch
from torch import nn

ROPES = ("none", "axial", "dinov3", "mixed")


class Rope2d(nn.Module):
    """Makes the table (sin | cos) for a patch grid: [N, 2 * head_dim], or [depth, heads, N, 2 * head_dim] for
    `mixed`, the only kind with parameters."""

    def __init__(self, head_dim: int, kind: str = "axial", temperature: float = 10000.0, grid_offset: float = 0.0,
                 xy: bool = False, ref_grid: tuple[int, int] | None = None, rotate_half: bool = False,
                 depth: int = 1, num_heads: int = 1):
        super().__init__()
        if kind not in ROPES[1:] or head_dim % 4 or (kind == "mixed" and rotate_half):
            from ..errors import ConfigError

            raise ConfigError(f"rope must be one of {ROPES[1:]} with head_dim % 4 == 0 (mixed: adjacent pairs), got "
                              f"{kind!r}, head_dim {head_dim}, rotate_half={rotate_half}")
        self.head_dim, self.kind, self.temperature = head_dim, kind, float(temperature)
        self.grid_offset, self.xy, self.ref_grid, self.rotate_half = grid_offset, xy, ref_grid, rotate_half
        self.freqs = None
        if kind == "mixed":
            # RoPE-Mixed's init: the axial magnitudes, turned by a random angle per block and head
            mag = 1.0 / self.temperature ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)  # [K]
            turn = torch.rand(depth, num_heads, 1) * 2 * math.pi
            fx = torch.cat([mag * torch.cos(turn), mag * torch.cos(turn + math.pi / 2)], dim=-1)  # [L, H, 2K]
            fy = torch.cat([mag * torch.sin(turn), mag * torch.sin(turn + math.pi / 2)], dim=-1)
            self.freqs = nn.Parameter(torch.stack([fx, fy]))  # [2, L, H, head_dim/2]

    def _angles(self, n: int, ref: int | None, device) -> torch.Tensor:
        """[n, K] rotation angles of one axis with n positions."""
        K = self.head_dim // 4
        k = torch.arange(K, device=device, dtype=torch.float32)
        if self.kind == "dinov3":
            pos = (torch.arange(n, device=device, dtype=torch.float32) + 0.5 + self.grid_offset) / n * 2.0 - 1.0
            return 2 * math.pi * pos[:, None] / self.temperature ** (2.0 * k / (self.head_dim // 2))[None]
        pos = torch.arange(n, device=device, dtype=torch.float32) + self.grid_offset
        if ref is not None:
            pos = pos / n * ref  # EVA: positions of a new grid are spread over the reference grid's range
        return pos[:, None] * (1.0 / self.temperature ** (k / K))[None]

    def table(self, grid: tuple[int, int], device=None) -> torch.Tensor:
        """[Gh*Gw, 2 * head_dim] sin | cos for a grid, rows in raster order ([depth, heads, Gh*Gw, 2 * head_dim]
        for `mixed`)."""
        gh, gw = grid
        if self.freqs is not None:
            rows, cols = torch.meshgrid(torch.arange(gh, device=device, dtype=torch.float32),
                                        torch.arange(gw, device=device, dtype=torch.float32), indexing="ij")
            x, y = (cols, rows) if self.xy else (rows, cols)
            f = self.freqs.float()
            angles = x.reshape(-1, 1) * f[0][..., None, :] + y.reshape(-1, 1) * f[1][..., None, :]  # [L, H, N, Dh/2]
            angles = angles.repeat_interleave(2, -1)
            return torch.cat([angles.sin(), angles.cos()], dim=-1)
        ref_h, ref_w = self.ref_grid or (None, None)
        ah, aw = self._angles(gh, ref_h, device), self._angles(gw, ref_w, device)  # [Gh, K], [Gw, K]
        ah = ah[:, None, :].expand(gh, gw, -1)  # [Gh, Gw, K]
        aw = aw[None, :, :].expand(gh, gw, -1)
        angles = torch.cat([aw, ah] if self.xy else [ah, aw], dim=-1).reshape(gh * gw, -1)  # [N, head_dim/2]
        # each angle rotates one pair of channels: the layout repeats it where the pair's two channels are
        angles = torch.cat([angles, angles], -1) if self.rotate_half else angles.repeat_interleave(2, -1)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # [N, 2 * head_dim]

    def extra_repr(self) -> str:
        return (f"kind={self.kind}, head_dim={self.head_dim}, temperature={self.temperature}, xy={self.xy}, "
                f"rotate_half={self.rotate_half}")


def apply_rope(x: torch.Tensor, table: torch.Tensor, rotate_half: bool = False) -> torch.Tensor:
    """Rotate the channel pairs of x [..., N, head_dim] by a table [..., N, 2 * head_dim] (sin | cos)."""
    sin, cos = table.chunk(2, dim=-1)
    if rotate_half:
        x1, x2 = x.chunk(2, dim=-1)
        turned = torch.cat([-x2, x1], dim=-1)  # (x_i, x_{i+D/2}) -> (-x_{i+D/2}, x_i)
    else:
        turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)  # (x0, x1) -> (-x1, x0)
    return (x * cos + turned * sin).to(x.dtype)
