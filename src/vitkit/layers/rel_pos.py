"""Relative position bias from a small MLP over log-spaced offsets (timm's RelPosMlp, 'cr' mode; the idea of
Swin V2's continuous position bias), for ViTs without an absolute position table (timm's vit_relpos_*).

For patches i and j at grid offsets (dh, dw), each head adds mlp(sign(d) * log(1 + |d|))[head] to the
attention logit q_i . k_j. The MLP is evaluated once per offset in the (2 Gh - 1) x (2 Gw - 1) range and gathered
into the [heads, N, N] bias; any grid works, because the MLP takes the offsets themselves. Prefix tokens get
zero bias (timm's padding)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _OffsetMlp(nn.Module):
    """2 -> hidden -> heads with ReLU; timm's Mlp key names (fc1, fc2) and its 0.125 dropout after the ReLU."""

    def __init__(self, hidden: int, num_heads: int):
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.act = nn.ReLU()
        self.drop1 = nn.Dropout(0.125)
        self.fc2 = nn.Linear(hidden, num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop1(self.act(self.fc1(x))))


class RelPosMlp(nn.Module):
    def __init__(self, num_heads: int, hidden: int = 128):
        super().__init__()
        self.num_heads = num_heads
        self.mlp = _OffsetMlp(hidden, num_heads)

    def forward(self, grid: tuple[int, int], num_prefix: int = 0) -> torch.Tensor:
        """[1, heads, P + N, P + N] additive attention bias for a (Gh, Gw) grid of patches after P prefix tokens."""
        gh, gw = grid
        device = self.mlp.fc1.weight.device
        dh = torch.arange(-(gh - 1), gh, device=device, dtype=torch.float32)
        dw = torch.arange(-(gw - 1), gw, device=device, dtype=torch.float32)
        offsets = torch.stack(torch.meshgrid(dh, dw, indexing="ij"), dim=-1)  # [2Gh-1, 2Gw-1, 2]
        offsets = torch.sign(offsets) * torch.log1p(offsets.abs())
        table = self.mlp(offsets.to(self.mlp.fc1.weight.dtype)).reshape(-1, self.num_heads)  # [(2Gh-1)(2Gw-1), H]
        rows = torch.arange(gh, device=device).repeat_interleave(gw)  # [N] row of each patch (raster order)
        cols = torch.arange(gw, device=device).repeat(gh)
        index = (rows[:, None] - rows[None] + gh - 1) * (2 * gw - 1) + (cols[:, None] - cols[None] + gw - 1)  # [N, N]
        bias = table[index].permute(2, 0, 1)  # [H, N, N]
        if num_prefix:
            bias = F.pad(bias, [num_prefix, 0, num_prefix, 0])
        return bias[None]
