"""Window attention (Swin): partition an NHWC map into windows, attend inside each with a learned relative
position bias, and the shifted-window attention mask.

Key names follow timm (`qkv`, `proj`, `relative_position_bias_table`); `relative_position_index` is a
non-persistent buffer, as in timm, so timm state dicts load strictly (the original repository's checkpoints
carry it and it is dropped on import).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import Linear


def window_partition(x: torch.Tensor, ws: tuple[int, int]) -> torch.Tensor:
    """[B, H, W, C] -> [B * nW, ws_h, ws_w, C] (H, W multiples of the window)."""
    B, H, W, C = x.shape
    x = x.view(B, H // ws[0], ws[0], W // ws[1], ws[1], C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, ws[0], ws[1], C)


def window_reverse(windows: torch.Tensor, ws: tuple[int, int], H: int, W: int) -> torch.Tensor:
    """[B * nW, ws_h, ws_w, C] -> [B, H, W, C]: the inverse of `window_partition`."""
    C = windows.shape[-1]
    x = windows.view(-1, H // ws[0], W // ws[1], ws[0], ws[1], C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


def relative_position_index(win_h: int, win_w: int, device=None) -> torch.Tensor:
    """[Wh*Ww, Wh*Ww] index into the ((2Wh-1)(2Ww-1), heads) bias table for every pair of window tokens."""
    coords = torch.stack(torch.meshgrid(torch.arange(win_h, device=device), torch.arange(win_w, device=device),
                                        indexing="ij")).flatten(1)  # [2, N]
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # [N, N, 2]
    return (rel[..., 0] + win_h - 1) * (2 * win_w - 1) + (rel[..., 1] + win_w - 1)


def shifted_window_mask(H: int, W: int, ws: tuple[int, int], shift: tuple[int, int], device=None,
                        dtype=torch.float32) -> torch.Tensor:
    """[nW, N, N] additive mask (0 or -100) keeping shifted windows from mixing regions that are not
    neighbours in the image; H, W are the (padded) map size, multiples of the window."""
    img = torch.zeros((1, H, W, 1), device=device, dtype=dtype)
    cnt = 0
    for h in ((0, -ws[0]), (-ws[0], -shift[0]), (-shift[0], None)):
        for w in ((0, -ws[1]), (-ws[1], -shift[1]), (-shift[1], None)):
            img[:, h[0]:h[1], w[0]:w[1], :] = cnt
            cnt += 1
    m = window_partition(img, ws).view(-1, ws[0] * ws[1])
    diff = m[:, None, :] - m[:, :, None]
    return torch.zeros_like(diff).masked_fill(diff != 0, -100.0)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside a window with a relative position bias (W-MSA / SW-MSA)."""

    def __init__(self, dim: int, num_heads: int, window_size: tuple[int, int], qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.window_size = tuple(window_size)
        win_h, win_w = self.window_size
        self.window_area = win_h * win_w
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * win_h - 1) * (2 * win_w - 1), num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer("relative_position_index", relative_position_index(win_h, win_w), persistent=False)
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def rel_pos_bias(self) -> torch.Tensor:
        """[1, heads, N, N]."""
        N = self.window_area
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        return bias.permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B*nW, N, C]; mask [nW, N, N] additive or None -> [B*nW, N, C]."""
        B_, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.rel_pos_bias().to(q.dtype)  # [1, h, N, N]
        if mask is not None:
            nw = mask.shape[0]
            bias = (bias.unsqueeze(1) + mask.to(q.dtype)[None, :, None]).expand(B_ // nw, -1, -1, -1, -1)
            bias = bias.reshape(B_, self.num_heads, N, N)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale,
                                           dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B_, N, C)))


def resize_rel_pos_bias_table(table: torch.Tensor, new_window: tuple[int, int]) -> torch.Tensor:
    """A square window's ((2w-1)^2, heads) bias table resampled bicubically to `new_window`, as the Swin
    authors do when fine-tuning at another window (Swin-Transformer utils.load_pretrained; issues #24, #58).
    timm resamples with BEiT's geometric grid instead, so tables resized here differ from timm's."""
    n, heads = table.shape
    side = int(round(n ** 0.5))
    if side * side != n:
        raise ValueError(f"a relative position table of {n} rows is not from a square window")
    dst = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    if (side, side) == dst:
        return table
    grid = table.float().t().reshape(1, heads, side, side)
    out = F.interpolate(grid, size=dst, mode="bicubic", align_corners=False)
    return out.reshape(heads, -1).t().contiguous().to(table.dtype)
