"""Multi-head self-attention with a fused (SDPA) default and an eager path that yields the weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import Linear


class AttentionMap(nn.Module):
    """Identity on the softmax probabilities [B, H, N, N]; exists so hooks have a named place to attach.

    It only runs on the eager path (fused attention never forms the matrix): ask for weights per call
    with `return_attn=True`, or set `attn.fused = False` on a block.
    """

    def forward(self, attn: torch.Tensor) -> torch.Tensor:
        return attn


def sdpa_is_slower(q: torch.Tensor) -> bool:
    """True where two plain matmuls + softmax beat F.scaled_dot_product_attention.

    On CPU in bf16/fp16 PyTorch's flash kernel is 2-5x slower than the matmul form at ViT sequence
    lengths (forward and backward; measured with torch 2.4-2.14). Past ~1k tokens the two are even and
    the [B, H, N, N] matrix gets large, so SDPA keeps those.
    """
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-2] <= 1024


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        eps: float = 1e-6,
    ):
        super().__init__()
        if dim % num_heads:
            from ..errors import ConfigError

            raise ConfigError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused = True
        # rows of qkv are ordered q | k | v, heads contiguous inside each (timm's layout)
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.attn_map = AttentionMap()
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, Dh]
        q, k = self.q_norm(q), self.k_norm(k)
        attn = None
        if self.fused and not return_attn and not sdpa_is_slower(q):
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # [B, H, N, N]
            attn = self.attn_map(attn.softmax(dim=-1))
            x = self.attn_drop(attn) @ v  # [B, H, N, Dh]
        x = x.transpose(1, 2).reshape(B, N, D)
        x = self.proj_drop(self.proj(x))
        return (x, attn) if return_attn else x
