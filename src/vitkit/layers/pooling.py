"""Pooling heads: attention pooling with a learned query (the MAP head of big_vision's SigLIP; timm's
AttentionPoolLatent key names: latent, q, kv, proj, norm, mlp), and the average-pool classifier of the feature-map
families (timm's `head.fc`)."""
from __future__ import annotations

import torch
from torch import nn

from .mlp import Linear, Mlp


class AttentionPoolLatent(nn.Module):
    """[B, N, D] tokens -> [B, D]: one learned query attends over the tokens, then a residual MLP."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, act: str = "gelu", eps: float = 1e-6,
                 qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = Linear(dim, dim, bias=qkv_bias)
        self.kv = Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act=act)
        nn.init.trunc_normal_(self.latent, std=dim**-0.5)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """valid: [B, N] bool, False for padding tokens the query must not attend to (layers/naflex.py)."""
        B, N, D = x.shape
        # per-sample query as timm computes it; a copy, not an expanded view of the parameter (module hooks
        # such as FlopCounterMode's cannot track a grad-requiring view made under no_grad)
        latent = self.latent.expand(B, -1, -1).contiguous()  # [B, 1, D]
        q = self.q(latent).reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, 1, Dh]
        kv = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)  # each [B, H, N, Dh]
        # one query: the plain matmul form costs what a fused kernel would, and FLOP counters see it
        attn = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)  # [B, H, 1, N]
        if valid is not None:
            attn = attn.masked_fill(~valid[:, None, None, :], float("-inf"))
        attn = attn.softmax(dim=-1)
        x = attn @ v  # [B, H, 1, Dh]
        x = self.proj(x.transpose(1, 2).reshape(B, 1, D))
        x = x + self.mlp(self.norm(x))
        return x[:, 0]  # [B, D]


class AvgPoolClassifier(nn.Module):
    """Average pool over a feature map's spatial dims, dropout, `fc` (timm's `head.fc`): `spatial_dims` (2, 3)
    for [B, C, H, W] maps, (1, 2) for [B, H, W, C] (Swin's NHWC)."""

    def __init__(self, dim: int, num_classes: int, drop: float, spatial_dims: tuple[int, int] = (2, 3)):
        super().__init__()
        self.spatial_dims = spatial_dims
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(x.mean(dim=self.spatial_dims))  # [B, C]
        return x if pre_logits else self.fc(x)
